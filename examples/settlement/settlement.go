package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
)

// Config is one settlement run.
type Config struct {
	Store       string        // lock store URL
	Ledger      string        // ledger URL: postgres://… or sqlite:PATH
	Merchants   int           // merchants to settle
	Workers     int           // workers, each with its own store and ledger connection
	TTL         time.Duration // lease TTL
	Date        string        // settlement date, YYYY-MM-DD
	PauseWorker int           // worker paused inside its first critical section; -1: none
	Pause       time.Duration // how long it is paused
	Work        time.Duration // time spent inside each critical section before the write
	Log         *slog.Logger
}

// Report is what a run prints.
type Report struct {
	Store         string  `json:"store"`
	Ledger        string  `json:"ledger"`
	Merchants     int     `json:"merchants"`
	Workers       int     `json:"workers"`
	Settled       int     `json:"settled"`
	Duplicates    int     `json:"duplicates"`
	StaleRejected int64   `json:"stale_rejected"`
	UniqueBlocked int64   `json:"unique_blocked"`
	Unavailable   int64   `json:"unavailable"`
	Seconds       float64 `json:"seconds"`
	Lock          Stats   `json:"lock"`
}

// Stats are the lock figures of a run, from the dlock.Observer hook.
type Stats struct {
	Acquisitions      int     `json:"acquisitions"`
	AcquireP50Ms      float64 `json:"acquire_p50_ms"`
	AcquireP99Ms      float64 `json:"acquire_p99_ms"`
	Contended         int     `json:"contended"`
	HoldP50Ms         float64 `json:"hold_p50_ms"`
	HoldP99Ms         float64 `json:"hold_p99_ms"`
	Renewals          int     `json:"renewals"`
	RenewalFailures   int     `json:"renewal_failures"`
	LostWhileWorking  int     `json:"lost_while_working"`
	MinRenewalMarginS float64 `json:"min_renewal_margin_s"`
}

// stats is a dlock.Observer that keeps every sample, so the report can give
// exact percentiles. (A service would use metrics.NewCollector instead.)
type stats struct {
	mu        sync.Mutex
	acquire   []time.Duration
	hold      []time.Duration
	contended int
	renewals  int
	failures  int
	lost      int
	minMargin time.Duration
}

func (s *stats) AcquireDone(e dlock.AcquireEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.contended += e.Contended
	if e.Result == dlock.ResultAcquired {
		s.acquire = append(s.acquire, e.Latency)
	}
}

func (s *stats) Renewed(e dlock.RenewEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.Err != nil {
		s.failures++
		return
	}
	s.renewals++
	if s.minMargin == 0 || e.Margin < s.minMargin {
		s.minMargin = e.Margin
	}
}

func (s *stats) LeaseEnded(e dlock.EndEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = append(s.hold, e.Held)
	if e.Lost {
		s.lost++
	}
}

func percentileMs(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p)
	return float64(s[i].Microseconds()) / 1000
}

func (s *stats) snapshot() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{
		Acquisitions: len(s.acquire),
		AcquireP50Ms: percentileMs(s.acquire, 0.50), AcquireP99Ms: percentileMs(s.acquire, 0.99),
		Contended: s.contended,
		HoldP50Ms: percentileMs(s.hold, 0.50), HoldP99Ms: percentileMs(s.hold, 0.99),
		Renewals: s.renewals, RenewalFailures: s.failures, LostWhileWorking: s.lost,
		MinRenewalMarginS: s.minMargin.Seconds(),
	}
}

// Run settles every merchant for cfg.Date exactly once and reports.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Merchants <= 0 || cfg.Workers <= 0 {
		return Report{}, fmt.Errorf("settlement: --merchants and --workers must be positive (got %d, %d)", cfg.Merchants, cfg.Workers)
	}
	if cfg.PauseWorker >= cfg.Workers || cfg.PauseWorker < -1 {
		return Report{}, fmt.Errorf("settlement: --pause-worker %d is not one of the %d workers (or -1 for none)", cfg.PauseWorker, cfg.Workers)
	}
	if cfg.PauseWorker >= 0 && cfg.Workers < 2 {
		return Report{}, fmt.Errorf("settlement: --pause-worker needs at least 2 workers: another one must take over the paused worker's merchant")
	}
	if cfg.Work < 0 {
		return Report{}, fmt.Errorf("settlement: --work %v is negative", cfg.Work)
	}
	if cfg.Pause < 0 {
		return Report{}, fmt.Errorf("settlement: --pause %v is negative", cfg.Pause)
	}
	if err := dlock.ValidateTTL(cfg.TTL); err != nil {
		return Report{}, fmt.Errorf("settlement: --ttl: %w", err)
	}
	if _, err := time.Parse("2006-01-02", cfg.Date); err != nil {
		return Report{}, fmt.Errorf("settlement: --date %q is not a date (YYYY-MM-DD)", cfg.Date)
	}
	setup, err := openLedger(ctx, cfg.Ledger)
	if err != nil {
		return Report{}, err
	}
	defer setup.Close()
	if err := migrate(ctx, setup); err != nil {
		return Report{}, err
	}

	st := &stats{}
	var staleRejected, uniqueBlocked, unavailable atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, cfg.Workers)
	for i := range cfg.Workers {
		w := &worker{id: i, cfg: cfg, stats: st, stale: &staleRejected, unique: &uniqueBlocked, unavailable: &unavailable}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.run(ctx); err != nil {
				errs <- fmt.Errorf("worker %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return Report{}, err
	}

	settled, dups, err := count(ctx, setup, cfg.Date)
	if err != nil {
		return Report{}, err
	}
	return Report{
		Store: cfg.Store, Ledger: redactURL(cfg.Ledger), Merchants: cfg.Merchants, Workers: cfg.Workers,
		Settled: settled, Duplicates: dups, StaleRejected: staleRejected.Load(), UniqueBlocked: uniqueBlocked.Load(),
		Unavailable: unavailable.Load(),
		Seconds:     time.Since(start).Seconds(), Lock: st.snapshot(),
	}, nil
}

// worker is one pod: its own lock store connection and ledger connection.
type worker struct {
	id     int
	cfg    Config
	stats  *stats
	stale  *atomic.Int64
	unique *atomic.Int64
	// unavailable counts attempts the store could not answer (an election
	// of a dlockd cluster, a restart): the merchant is left for a later pass.
	unavailable *atomic.Int64
	paused      bool
	faults      *dlocktest.FaultDriver
}

func (w *worker) run(ctx context.Context) error {
	// The worker that will be paused gets a fault injector on its store
	// connection, so that its pause freezes its heartbeat too, as a real
	// GC pause or SIGSTOP freezes the whole process.
	locker, faults, err := dlocktest.OpenFaulty(ctx, w.cfg.Store,
		dlock.WithObserver(w.stats), dlock.WithKeyClass("settlement"),
		dlock.WithHolder(fmt.Sprintf("settlement worker %d", w.id)))
	if err != nil {
		return err
	}
	w.faults = faults
	defer locker.Close()
	db, err := openLedger(ctx, w.cfg.Ledger)
	if err != nil {
		return err
	}
	defer db.Close()

	// Each worker walks the merchants in its own order, as independent pods
	// would, and keeps passing over the unsettled ones until none is left.
	order := rand.Perm(w.cfg.Merchants)
	for pass := 0; ; pass++ {
		left := 0
		for _, m := range order {
			merchant := fmt.Sprintf("m%05d", m)
			done, err := isSettled(ctx, db, merchant, w.cfg.Date)
			if err != nil {
				return err
			}
			if done {
				continue
			}
			left++
			if err := w.settle(ctx, locker, db, merchant); err != nil {
				return err
			}
		}
		if left == 0 {
			return nil
		}
		if pass > 10_000 {
			return errors.New("merchants still unsettled after 10,000 passes")
		}
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	}
}

func (w *worker) settle(ctx context.Context, locker *dlock.Locker, db *sql.DB, merchant string) error {
	key := fmt.Sprintf("settle:{%s}:%s", merchant, w.cfg.Date)
	lease, err := locker.TryAcquire(ctx, key, dlock.WithTTL(w.cfg.TTL))
	if errors.Is(err, dlock.ErrNotAcquired) {
		return nil // another worker is on it
	}
	if errors.Is(err, dlock.ErrUnavailable) {
		// The store could not answer (a leader election, a restart): no
		// lease, no work. A later pass tries this merchant again.
		w.unavailable.Add(1)
		w.cfg.Log.Info("lock store unavailable, merchant left for a later pass", "worker", w.id, "merchant", merchant, "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	defer lease.Release(context.WithoutCancel(ctx))
	work := lease.Context()

	// Re-check under the lock: another worker may have finished it.
	if done, err := isSettled(work, db, merchant, w.cfg.Date); err != nil || done {
		return ignoreLost(err)
	}
	amount := amountFor(merchant)
	if w.cfg.Work > 0 {
		// The work of the critical section (computing the settlement).
		select {
		case <-time.After(w.cfg.Work):
		case <-work.Done():
			return nil // lease lost or run cancelled: leave it for a later pass
		}
	}

	if w.id == w.cfg.PauseWorker && !w.paused {
		// The GC-pause case: stopped inside the critical section for
		// longer than the TTL. The lease is lost meanwhile and another
		// worker settles this merchant with a greater fence. When this
		// one wakes it writes anyway, as a paused process would, with no
		// chance to look at its lease first; only the fence stops it.
		w.paused = true
		w.cfg.Log.Info("pausing inside the critical section", "worker", w.id, "merchant", merchant, "fence", lease.Fence(), "pause", w.cfg.Pause)
		w.faults.BlockRenewals(true)
		time.Sleep(w.cfg.Pause)
		// Stay paused until another worker has settled this merchant, so
		// the late write below always meets a newer fence (on a slow
		// machine the others may need longer than the pause to get here).
		for waited := time.Duration(0); waited < 60*time.Second; waited += 10 * time.Millisecond {
			if done, err := isSettled(ctx, db, merchant, w.cfg.Date); err == nil && done {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		w.faults.BlockRenewals(false)
		work = context.WithoutCancel(work)
	}
	err = writeSettlement(work, db, merchant, w.cfg.Date, amount, lease.Fence(), w.id)
	switch {
	case errors.Is(err, dlock.ErrStaleFence):
		w.stale.Add(1)
		w.cfg.Log.Info("stale write rejected by the fence", "worker", w.id, "merchant", merchant, "fence", lease.Fence())
		return nil
	case errors.Is(err, errDuplicate):
		w.unique.Add(1)
		w.cfg.Log.Info("duplicate blocked by the unique constraint", "worker", w.id, "merchant", merchant)
		return nil
	}
	return ignoreLost(err)
}

// ignoreLost treats work cut short by a lost lease as "not done": the
// merchant stays unsettled and some worker picks it up again.
func ignoreLost(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, dlock.ErrLeaseLost) {
		return nil
	}
	return err
}

func amountFor(merchant string) int64 {
	var h int64
	for _, c := range merchant {
		h = h*31 + int64(c)
	}
	return 1000 + h%100_000
}
