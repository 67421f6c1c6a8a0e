package bench

import (
	"fmt"
	"io"
	"net/url"
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
	return u.Scheme
}

// Markdown writes the report as three Markdown tables.
func (r Report) Markdown(w io.Writer) {
	if len(r.Uncontended) > 0 {
		fmt.Fprintln(w, "### W1 — uncontended acquire+release (each client its own key)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| store | clients | cycles/s | acquire p50 | acquire p99 | errors |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
		for _, c := range r.Uncontended {
			fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s | %d |\n", storeName(c.Store), c.Clients, c.CyclesPerSec, us(c.AcquireP50Us), us(c.AcquireP99Us), c.Errors)
		}
		fmt.Fprintln(w)
	}
	if len(r.Contended) > 0 {
		fmt.Fprintln(w, "### W2 — contended handoff (all clients on one key)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| store | clients | handoffs/s | gap p50 | gap p99 | longest wait | errors |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
		for _, c := range r.Contended {
			fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s | %.1f ms | %d |\n", storeName(c.Store), c.Clients, c.HandoffsPerSec, us(c.GapP50Us), us(c.GapP99Us), c.LongestWaitMs, c.Errors)
		}
		fmt.Fprintln(w)
	}
	if len(r.Held) > 0 {
		fmt.Fprintln(w, "### W3 — many keys held at once")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| store | keys | time to acquire all | server memory before | server memory, keys held | errors |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
		for _, h := range r.Held {
			if h.Skipped != "" {
				fmt.Fprintf(w, "| %s | %d | not run: %s | | | |\n", storeName(h.Store), h.Keys, h.Skipped)
				continue
			}
			fmt.Fprintf(w, "| %s | %d | %.2f s | %s | %s | %d |\n", storeName(h.Store), h.Keys, h.AcquireSeconds, mib(h.RSSBeforeMiB), mib(h.ServerRSSMiB), h.Errors)
		}
		fmt.Fprintln(w)
	}
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
