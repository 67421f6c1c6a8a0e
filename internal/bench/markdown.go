package bench

import (
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// storeName shortens a URL to its scheme for table rows (the run's
// addresses are loopback ports of no interest).
func storeName(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return raw
	}
	if u.Scheme == "mem" {
		return raw
	}
	if privateConns(raw) {
		return "dlockd, own connections"
	}
	return u.Scheme
}

// Markdown writes the report as Markdown tables: the baseline (when the
// run measured it), then W1, W2 and W3. With a baseline, W1 and W2 rows
// carry their ratio to raw Redis at the same client count, and W2 rows of
// durable stores their ratio to the one-durable-write-per-handoff limit.
func (r Report) Markdown(w io.Writer) {
	rawW1 := map[int]float64{}
	rawW2 := map[int]float64{}
	recipe := map[string]map[int]float64{"etcd": {}, "zk": {}} // store name → clients → raw recipe cycles/s
	var lim Limits
	if b := r.Baseline; b != nil {
		lim = b.Limits
		for _, c := range b.RawRedis {
			rawW1[c.Clients] = c.CyclesPerSec
		}
		for _, c := range b.RawRedisContended {
			rawW2[c.Clients] = c.HandoffsPerSec
		}
		for _, c := range b.RawEtcd {
			recipe["etcd"][c.Clients] = c.CyclesPerSec
		}
		for _, c := range b.RawZK {
			recipe["zk"][c.Clients] = c.CyclesPerSec
		}
		fmt.Fprintln(w, "### Baseline — this machine in this run")
		fmt.Fprintln(w)
		if lim.LoopbackRTTP50Us > 0 {
			fmt.Fprintf(w, "- loopback TCP round trip: p50 %s, p99 %s\n", us(lim.LoopbackRTTP50Us), us(lim.LoopbackRTTP99Us))
			fmt.Fprintf(w, "- 4 KiB append + fdatasync in %s: p50 %s, p99 %s\n", lim.FsyncDir, us(lim.FsyncP50Us), us(lim.FsyncP99Us))
			fmt.Fprintf(w, "- one durable write per handoff allows 1 / (fdatasync p50 + round trip p50) = %.0f handoffs/s\n", lim.HandoffLimit())
		}
		if len(b.RawRedis) > 0 {
			fmt.Fprintln(w, "- raw Redis: go-redis alone, `SET key token NX PX` then the compare-and-delete Lua release, each client its own connection (W2: waiters poll SET NX with no pause); no renewal, no fence, no durability")
			fmt.Fprintln(w)
			fmt.Fprintln(w, "| raw Redis | clients | cycles or handoffs/s | p50 | p99 | longest wait | fairness |")
			fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
			for _, c := range b.RawRedis {
				fmt.Fprintf(w, "| W1 | %d | %.0f | %s | %s | | |\n", c.Clients, c.CyclesPerSec, us(c.AcquireP50Us), us(c.AcquireP99Us))
			}
			for _, c := range b.RawRedisContended {
				fmt.Fprintf(w, "| W2 | %d | %.0f | %s | %s | %.1f ms | %.2f |\n", c.Clients, c.HandoffsPerSec, us(c.GapP50Us), us(c.GapP99Us), c.LongestWaitMs, c.Fairness)
			}
		}
		if len(b.RawEtcd) > 0 || len(b.RawZK) > 0 {
			if lim.LoopbackRTTP50Us > 0 || len(b.RawRedis) > 0 {
				fmt.Fprintln(w) // after the lines above; the heading's blank line otherwise
			}
			if len(b.RawEtcd) > 0 {
				fmt.Fprintln(w, "- raw etcd recipe: the official client alone, one lease per client granted once, `Txn(If CreateRevision(key) == 0).Then(Put(key, token, lease))` then `Txn(If CreateRevision(key) == fence).Then(Delete(key))`, each client its own connection; no renewal, no waiting")
			}
			if len(b.RawZK) > 0 {
				fmt.Fprintln(w, "- raw ZooKeeper recipe: go-zookeeper alone, one session per client, create an ephemeral node at the key then delete it at version 0; no fence, no renewal, no waiting")
			}
			fmt.Fprintln(w)
			fmt.Fprintln(w, "| raw recipe | clients | cycles/s | acquire p50 | acquire p99 | errors |")
			fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
			for _, c := range append(slices.Clone(b.RawEtcd), b.RawZK...) {
				fmt.Fprintf(w, "| %s W1 | %d | %.0f | %s | %s | %d |\n", c.Store, c.Clients, c.CyclesPerSec, us(c.AcquireP50Us), us(c.AcquireP99Us), c.Errors)
			}
		}
		fmt.Fprintln(w)
	}
	// durable: the stores whose every grant is on disk before it is
	// answered, for which the disk limit means something.
	durable := func(store string) bool {
		name, _, _ := strings.Cut(storeName(store), ",")
		switch name {
		case "dlockd", "etcd", "zk", "postgres", "postgresql", "consul":
			return true
		}
		return false
	}
	if len(r.Uncontended) > 0 {
		fmt.Fprintln(w, "### W1 — uncontended acquire+release (each client its own key)")
		fmt.Fprintln(w)
		paired := false
		for _, c := range r.Uncontended {
			paired = paired || c.RawRedisBefore > 0 || c.RawRecipeBefore > 0
		}
		if paired {
			// Config.PairedBaselines: each ratio is against the raw cell
			// run just before the row's, named beside it.
			fmt.Fprintln(w, "Each ratio is against the raw cell run just before this row's, at the same client count (its cycles/s in brackets), not against the baseline measured at the start of the run.")
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "| store | clients | cycles/s | × raw Redis | × raw recipe | acquire p50 | acquire p99 | errors |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, c := range r.Uncontended {
			name := storeName(c.Store)
			// × raw recipe: etcd and zk rows against their store's raw
			// recipe at the same client count.
			fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s | %s | %s | %d |\n", name, c.Clients, c.CyclesPerSec,
				pairedRatio(c.CyclesPerSec, c.RawRedisBefore, rawW1[c.Clients]),
				pairedRatio(c.CyclesPerSec, c.RawRecipeBefore, recipe[name][c.Clients]),
				us(c.AcquireP50Us), us(c.AcquireP99Us), c.Errors)
		}
		fmt.Fprintln(w)
	}
	if len(r.Contended) > 0 {
		fmt.Fprintln(w, "### W2 — contended handoff (all clients on one key)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| store | clients | handoffs/s | × raw Redis | × disk limit | gap p50 | gap p99 | longest wait | fairness | errors |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, c := range r.Contended {
			disk := ""
			if durable(c.Store) {
				disk = ratio(c.HandoffsPerSec, lim.HandoffLimit())
			}
			fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s | %s | %s | %.1f ms | %.2f | %d |\n", storeName(c.Store), c.Clients, c.HandoffsPerSec, ratio(c.HandoffsPerSec, rawW2[c.Clients]), disk, us(c.GapP50Us), us(c.GapP99Us), c.LongestWaitMs, c.Fairness, c.Errors)
		}
		fmt.Fprintln(w)
	}
	if len(r.Held) > 0 {
		fmt.Fprintln(w, "### W3 — many keys held at once")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| store | keys | time to acquire all | server memory before | server memory, keys held | settled (PSS / RSS) | errors |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
		for _, h := range r.Held {
			if h.Skipped != "" {
				fmt.Fprintf(w, "| %s | %d | not run: %s | | | | |\n", storeName(h.Store), h.Keys, h.Skipped)
				continue
			}
			keys := strconv.Itoa(h.Keys)
			if h.Capped != "" {
				keys += " (" + h.Capped + ")"
			}
			settled := ""
			if h.SettledMiB > 0 {
				settled = mib(h.SettledMiB) + " / " + mib(h.SettledRSSMiB)
			}
			fmt.Fprintf(w, "| %s | %s | %.2f s | %s | %s | %s | %d |\n", storeName(h.Store), keys, h.AcquireSeconds, mib(h.RSSBeforeMiB), mib(h.ServerRSSMiB), settled, h.Errors)
		}
		fmt.Fprintln(w)
	}
}

// pairedRatio is v against before, the raw cell run just before v's, as
// "0.42× (38600)"; without one, v against base, the run's baseline (ratio).
func pairedRatio(v, before, base float64) string {
	if before > 0 {
		return fmt.Sprintf("%s (%.0f)", ratio(v, before), before)
	}
	return ratio(v, base)
}

// ratio is v/base as "0.42×", blank when base was not measured.
func ratio(v, base float64) string {
	if base <= 0 {
		return ""
	}
	return fmt.Sprintf("%.2f×", v/base)
}

func us(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2f ms", v/1000)
	}
	return fmt.Sprintf("%.0f µs", v)
}

func mib(v float64) string {
	if v == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", v)
}
