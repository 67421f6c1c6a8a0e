package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/dlock-dev/dlock"
)

// FailoverConfig is one failover measurement: Tries times, the leader of a
// replicated store is killed (kill -9) and the time until a client naming
// every member is granted a free key by the new leader is taken.
type FailoverConfig struct {
	// Store is the store URL, naming every member.
	Store string
	// Tries is the number of kills. Default 20, at most 1000.
	Tries int
	// KillLeader finds the current leader and kills it with SIGKILL,
	// returning the moment the signal was sent. The clock starts there.
	KillLeader func(ctx context.Context) (time.Time, error)
	// Recover restarts the killed member on its data and returns once the
	// cluster has every member back (so that each try starts whole).
	Recover func(ctx context.Context) error
	// GrantTimeout bounds the wait for the first grant of one try. Default
	// 30 s; a try that reaches it fails the measurement.
	GrantTimeout time.Duration
	// AttemptTimeout bounds one TryAcquire while the cluster elects: an
	// attempt sent to the dead leader, or stuck on its connection, is given
	// up after it and tried again. It is the resolution of the measurement.
	// Default 300 ms.
	AttemptTimeout time.Duration
	// Progress, when set, is told about each try.
	Progress func(format string, args ...any)
}

// Failover is the result of one failover measurement.
type Failover struct {
	Store string `json:"store"`
	// Tries is the number of kills measured.
	Tries int `json:"tries"`
	// P50Ms, MaxMs and MinMs are the median, longest and shortest time from
	// the kill to the first grant, in milliseconds.
	P50Ms float64 `json:"p50_ms"`
	MaxMs float64 `json:"max_ms"`
	MinMs float64 `json:"min_ms"`
	// Attempts is the number of TryAcquire calls that failed while the
	// cluster had no leader, over all tries.
	Attempts int `json:"failed_attempts"`
}

// MeasureFailover runs cfg.Tries kill-and-grant rounds against cfg.Store
// (see FailoverConfig) and returns the median and longest time from the
// kill to the first grant of a key nobody holds, as a client sees it: the
// attempts go through the public dlock API, so an attempt cut off by its
// AttemptTimeout returns only once the library's clean-up release of that
// attempt was answered (or its op timeout passed): an error from Acquire
// means nothing was left behind. During an election that release is
// answered by the new leader, so the figure is the time until the new
// leader answers a client, plus one grant. Every round is bounded by
// GrantTimeout; it returns an error when a round gets no grant within it,
// when KillLeader or Recover fail, or when ctx ends.
func MeasureFailover(ctx context.Context, cfg FailoverConfig) (Failover, error) {
	if cfg.Tries <= 0 {
		cfg.Tries = 20
	}
	if cfg.Tries > 1000 {
		return Failover{}, fmt.Errorf("bench: failover tries %d is over 1000", cfg.Tries)
	}
	if cfg.GrantTimeout <= 0 {
		cfg.GrantTimeout = 30 * time.Second
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 300 * time.Millisecond
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	if cfg.KillLeader == nil || cfg.Recover == nil {
		return Failover{}, errors.New("bench: failover needs KillLeader and Recover")
	}
	res := Failover{Store: cfg.Store, Tries: cfg.Tries}
	l, err := dlock.Open(ctx, cfg.Store, dlock.WithTTL(30*time.Second), dlock.WithKeyClass("bench"))
	if err != nil {
		return res, err
	}
	defer l.Close()
	var took []time.Duration
	for i := range cfg.Tries {
		// A grant before the kill: the client is connected to the leader,
		// as a running service would be.
		warm := fmt.Sprintf("bench:failover:%s:warm:%d", runID, i)
		if err := grantOnce(ctx, l, warm, cfg.GrantTimeout, cfg.AttemptTimeout, nil); err != nil {
			return res, fmt.Errorf("bench: failover try %d: no grant before the kill: %w", i+1, err)
		}
		killed, err := cfg.KillLeader(ctx)
		if err != nil {
			return res, fmt.Errorf("bench: failover try %d: kill the leader: %w", i+1, err)
		}
		key := fmt.Sprintf("bench:failover:%s:%d", runID, i)
		var failed int
		err = grantOnce(ctx, l, key, cfg.GrantTimeout, cfg.AttemptTimeout, &failed)
		d := time.Since(killed)
		res.Attempts += failed
		if err != nil {
			return res, fmt.Errorf("bench: failover try %d: no grant within %v of the kill: %w", i+1, cfg.GrantTimeout, err)
		}
		took = append(took, d)
		cfg.Progress("failover %s try %d: first grant %v after the kill (%d failed attempts)", Redact(cfg.Store), i+1, d.Round(time.Millisecond), failed)
		if err := cfg.Recover(ctx); err != nil {
			return res, fmt.Errorf("bench: failover try %d: recover the killed member: %w", i+1, err)
		}
	}
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	res.P50Ms = ms(took[(len(took)-1)/2])
	res.MaxMs = ms(took[len(took)-1])
	res.MinMs = ms(took[0])
	return res, nil
}

// grantOnce tries to acquire key (free) until it is granted, then releases
// it. Each attempt is bounded by attempt, the whole by total; failed counts
// the attempts that failed.
func grantOnce(ctx context.Context, l *dlock.Locker, key string, total, attempt time.Duration, failed *int) error {
	ctx, cancel := context.WithTimeout(ctx, total)
	defer cancel()
	var last error
	for {
		actx, acancel := context.WithTimeout(ctx, attempt)
		ls, err := l.TryAcquire(actx, key)
		acancel()
		if err == nil {
			return release(ctx, ls)
		}
		last = err
		if failed != nil {
			*failed++
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// ClusterReport is a cluster benchmark run: the workloads of Run against
// several clusters, labelled, and their failover times.
type ClusterReport struct {
	Report
	// Labels names each store URL in the tables ("dlockd 3 nodes").
	Labels map[string]string `json:"labels"`
	// Failover is one row per measured store.
	Failover []Failover `json:"failover"`
}

func (r ClusterReport) label(store string) string {
	if l := r.Labels[store]; l != "" {
		return l
	}
	return storeName(store)
}

// Markdown writes the report as Markdown tables: W1, W2 and failover.
func (r ClusterReport) Markdown(w io.Writer) {
	if len(r.Uncontended) > 0 {
		fmt.Fprintln(w, "#### W1 — uncontended acquire+release (each client its own key)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| cluster | clients | cycles/s | acquire p50 | acquire p99 | errors |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
		for _, c := range r.Uncontended {
			fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s | %d |\n", r.label(c.Store), c.Clients, c.CyclesPerSec, us(c.AcquireP50Us), us(c.AcquireP99Us), c.Errors)
		}
		fmt.Fprintln(w)
	}
	if len(r.Contended) > 0 {
		fmt.Fprintln(w, "#### W2 — contended handoff (all clients on one key)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| cluster | clients | handoffs/s | gap p50 | gap p99 | longest wait | errors |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
		for _, c := range r.Contended {
			fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s | %.1f ms | %d |\n", r.label(c.Store), c.Clients, c.HandoffsPerSec, us(c.GapP50Us), us(c.GapP99Us), c.LongestWaitMs, c.Errors)
		}
		fmt.Fprintln(w)
	}
	if len(r.Failover) > 0 {
		fmt.Fprintln(w, "#### Failover — kill -9 of the leader to the first grant of a free key")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| cluster | tries | p50 | max | min | failed attempts meanwhile |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
		for _, f := range r.Failover {
			fmt.Fprintf(w, "| %s | %d | %.0f ms | %.0f ms | %.0f ms | %d |\n", r.label(f.Store), f.Tries, f.P50Ms, f.MaxMs, f.MinMs, f.Attempts)
		}
		fmt.Fprintln(w)
	}
}
