// Package bench runs dlock's side-by-side store benchmarks (dlock bench):
// the same bounded workloads against any list of store URLs, through the
// public dlock API, so that every figure includes the client's own work.
//
//	W1  uncontended: N clients, each on its own key, Acquire+Release in a loop
//	W2  contended:   N clients on one key; handoffs/s, the gap from a release
//	    to the next grant, and the longest wait
//	W3  many held:   K keys held at once; time to acquire them all and the
//	    store server's resident memory (when its PID is given)
//
// Every client opens its own Locker, as separate processes would, except
// that the dlockd driver's Lockers of one process share one connection
// (its default; private_conn=1 in the URL gives each its own). Every loop is bounded by a duration and every run by a
// count.
package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// Config is one benchmark run.
type Config struct {
	Stores           []string       // store URLs
	Clients          []int          // W1 client counts (default 1, 8, 64)
	ContendedClients []int          // W2 client counts (default 8, 64)
	Duration         time.Duration  // length of each W1/W2 cell (default 3 s)
	HoldKeys         int            // W3 keys held at once (default 100,000; 0 skips W3 only if SkipHold)
	SkipHold         bool           // skip W3
	ServerPIDs       map[string]int // store URL → server PID, for W3 memory
	// HoldSettle is how long W3 keeps its keys held after the last grant
	// before it reads the server's memory a second time (Held.SettledMiB):
	// a Go server's collector and a JVM's take seconds to give back what
	// the burst of grants used. 0: no second reading.
	HoldSettle time.Duration
	// RawRedisAddr, when set (host:port), adds the raw Redis baselines:
	// W1 and W2 with go-redis alone (Baseline).
	RawRedisAddr string
	// RawEtcdEndpoint, when set (host:port[,host:port…]), adds W1 with the
	// official etcd client alone (RawEtcdUncontended), the base of the etcd
	// rows' "× raw recipe".
	RawEtcdEndpoint string
	// RawZKAddr, when set (host:port[,host:port…]), adds W1 with
	// go-zookeeper/zk alone (RawZKUncontended), the base of the zk rows'
	// "× raw recipe".
	RawZKAddr string
	// LimitsDir, when set, adds the machine's limits (a loopback round
	// trip, fdatasync of 4 KiB appends in this directory: that of a
	// durable store's data).
	LimitsDir string
	// PairedBaselines, with RawRedisAddr (and RawEtcdEndpoint, RawZKAddr
	// for the etcd and zk rows), runs the raw W1 cell again just before
	// each store's W1 cell at the same client count, and the row's ratios
	// are taken against it (Uncontended.RawRedisBefore, RawRecipeBefore)
	// rather than against the baseline measured at the start of the run,
	// minutes earlier: a shared machine's speed drifts by more than the
	// differences the ratios are read for. Each W1 cell then takes twice
	// as long, three times on etcd and zk with both their baselines (the
	// run-start baseline is still measured, for its own table).
	PairedBaselines bool
	Progress        func(format string, args ...any)
	// Touching, when set, is called with a store's URL just before the
	// run's first call to it (its probe): only a store it was called for
	// may hold anything of the run's. A run that fails earlier (a usage
	// error, a baseline's server down, an earlier store's failure) touches
	// no store after it.
	Touching func(store string)
}

// MinDuration is the shortest W1 and W2 cell Run accepts: a shorter one
// ends before its clients made a cycle, and its row reads zero.
const MinDuration = 100 * time.Millisecond

// Check returns the first error of cfg a run would refuse before any store
// or baseline call: a client count outside [1, 10000] or given twice in
// one list (the ratios look rows up by client count), a Duration under
// MinDuration (zero and negative durations are the default, 3 s). Run
// calls it; a caller may call it before it prepares the stores.
func (c Config) Check() error {
	for _, n := range append(slices.Clone(c.Clients), c.ContendedClients...) {
		if n < 1 || n > 10_000 {
			return fmt.Errorf("bench: client count %d is outside [1, 10000]", n)
		}
	}
	for _, counts := range [][]int{c.Clients, c.ContendedClients} {
		for i, n := range counts {
			if slices.Contains(counts[:i], n) {
				return fmt.Errorf("bench: client count %d is given twice", n)
			}
		}
	}
	if c.Duration > 0 && c.Duration < MinDuration {
		return fmt.Errorf("bench: duration %v is shorter than %v: a cell would end before its clients made a cycle", c.Duration, MinDuration)
	}
	return nil
}

func (c *Config) defaults() {
	if len(c.Clients) == 0 {
		c.Clients = []int{1, 8, 64}
	}
	if len(c.ContendedClients) == 0 {
		c.ContendedClients = []int{8, 64}
	}
	if c.Duration <= 0 {
		c.Duration = 3 * time.Second // zero or negative: the default
	}
	if c.HoldKeys <= 0 {
		c.HoldKeys = 100_000
	}
	if c.Progress == nil {
		c.Progress = func(string, ...any) {}
	}
}

// Uncontended is one W1 cell.
type Uncontended struct {
	Store        string  `json:"store"`
	Clients      int     `json:"clients"`
	CyclesPerSec float64 `json:"cycles_per_sec"`
	AcquireP50Us float64 `json:"acquire_p50_us"`
	AcquireP99Us float64 `json:"acquire_p99_us"`
	Errors       int64   `json:"errors"`
	// RawRedisBefore and RawRecipeBefore are the cycles/s of the raw
	// Redis cell and of the store's raw recipe (etcd, zk) run just
	// before this one at the same client count (Config.PairedBaselines);
	// 0: not run.
	RawRedisBefore  float64 `json:"raw_redis_before_cycles_per_sec,omitempty"`
	RawRecipeBefore float64 `json:"raw_recipe_before_cycles_per_sec,omitempty"`
}

// Contended is one W2 cell.
type Contended struct {
	Store          string  `json:"store"`
	Clients        int     `json:"clients"`
	HandoffsPerSec float64 `json:"handoffs_per_sec"`
	GapP50Us       float64 `json:"gap_p50_us"`
	GapP99Us       float64 `json:"gap_p99_us"`
	LongestWaitMs  float64 `json:"longest_wait_ms"`
	// Fairness is Jain's index of the grants per client: 1 when every
	// client was granted as often (FIFO handoffs), 1/clients when one
	// client took them all.
	Fairness float64 `json:"fairness"`
	Errors   int64   `json:"errors"`
}

// Held is one W3 row.
type Held struct {
	Store          string  `json:"store"`
	Keys           int     `json:"keys"`
	AcquireSeconds float64 `json:"acquire_seconds"`
	ServerRSSMiB   float64 `json:"server_rss_mib,omitempty"` // 0: PID unknown
	RSSBeforeMiB   float64 `json:"server_rss_before_mib,omitempty"`
	// SettledMiB is the server's memory Config.HoldSettle after the last
	// grant, the keys still held (0: not read).
	SettledMiB float64 `json:"server_settled_mib,omitempty"`
	// SettledRSSMiB is the resident set (VmRSS, shared pages counted in
	// full) at the same moment, the figure dlockd's memory target is set in.
	SettledRSSMiB float64 `json:"server_settled_rss_mib,omitempty"`
	Errors        int64   `json:"errors"`
	Skipped       string  `json:"skipped,omitempty"` // why W3 was not run for this store
	Capped        string  `json:"capped,omitempty"`  // why Keys is below Config.HoldKeys
}

// holdCap returns how many keys W3 holds on store when asked for keys, and
// why, when that is fewer: the emulators of the cloud stores slow down with
// every object they hold (fake-gcs-server scans its object list on each
// request: 5,000 keys took it 54 s, and 100,000 made it stop answering) or
// are slow at any size, so their rows hold a few thousand keys and say so.
func holdCap(store string, keys int) (int, string) {
	caps := []struct {
		scheme string
		max    int
		why    string
	}{
		{"gs:", 2_000, "the emulator scans its object list on each request"},
		{"azblob:", 2_000, "the emulator took 15 s for 2,000 in an earlier run"},
		{"dynamodb:", 10_000, "the emulator took 37 s for 10,000 in an earlier run"},
	}
	for _, c := range caps {
		if strings.HasPrefix(store, c.scheme) && keys > c.max {
			return c.max, fmt.Sprintf("%d of the %d asked for: %s", c.max, keys, c.why)
		}
	}
	return keys, ""
}

// holdSkipped says why W3 cannot run on a store: pgadvisory holds one
// PostgreSQL session per lease, so 100,000 held keys would need 100,000
// server connections.
func holdSkipped(store string) string {
	if strings.HasPrefix(store, "pgadvisory:") {
		return "one PostgreSQL session per held lease"
	}
	if privateConns(store) {
		return "the same dlockd as the row of shared connections"
	}
	return ""
}

// privateConns reports whether store is a dlockd URL whose Drivers each
// dial a connection of their own (private_conn=1), as clients in separate
// processes do; without it the Drivers of one process share connections.
func privateConns(store string) bool {
	u, err := url.Parse(store)
	return err == nil && u.Scheme == "dlockd" && u.Query().Get("private_conn") == "1"
}

// Redact returns store with its password and secret-looking parameters
// masked (urlparam.RedactString).
func Redact(store string) string { return urlparam.RedactString(store) }

// Report is the whole run.
type Report struct {
	Baseline    *Baseline     `json:"baseline,omitempty"` // with Config.LimitsDir or a Config.Raw* address
	Uncontended []Uncontended `json:"uncontended"`
	Contended   []Contended   `json:"contended"`
	Held        []Held        `json:"held"`
}

// Empty reports whether r holds no measurement: no baseline and no cell.
func (r Report) Empty() bool {
	return r.Baseline == nil && len(r.Uncontended) == 0 && len(r.Contended) == 0 && len(r.Held) == 0
}

// Run runs every workload against every store, one after the other. On an
// error (or when ctx ends) it returns the cells finished before it, the
// baseline's included, with the error; a failed baseline ends the run
// before any store's cell.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Check(); err != nil {
		return Report{}, err
	}
	cfg.defaults()
	var rep Report
	if cfg.LimitsDir != "" || cfg.RawRedisAddr != "" || cfg.RawEtcdEndpoint != "" || cfg.RawZKAddr != "" {
		b, err := runBaseline(ctx, cfg)
		if !b.empty() {
			rep.Baseline = &b // with an error: the baseline's cells finished before it
		}
		if err != nil {
			return rep, err
		}
	}
	for _, store := range cfg.Stores {
		if cfg.Touching != nil {
			cfg.Touching(store)
		}
		if err := probe(ctx, store); err != nil {
			return rep, &StoreError{Store: store, Err: err, Probe: true}
		}
		for _, n := range cfg.Clients {
			var rawRedis, rawRecipe float64
			if cfg.PairedBaselines {
				var err error
				if rawRedis, rawRecipe, err = pairedBaselines(ctx, cfg, store, n); err != nil {
					return rep, err
				}
			}
			cfg.Progress("W1 %s, %d clients", Redact(store), n)
			r, err := uncontended(ctx, store, n, cfg.Duration)
			if err != nil {
				return rep, &StoreError{Store: store, Err: err}
			}
			r.RawRedisBefore, r.RawRecipeBefore = rawRedis, rawRecipe
			rep.Uncontended = append(rep.Uncontended, r)
		}
		for _, n := range cfg.ContendedClients {
			cfg.Progress("W2 %s, %d clients on one key", Redact(store), n)
			r, err := contended(ctx, store, n, cfg.Duration)
			if err != nil {
				return rep, &StoreError{Store: store, Err: err}
			}
			rep.Contended = append(rep.Contended, r)
		}
		if why := holdSkipped(store); why != "" && !cfg.SkipHold {
			rep.Held = append(rep.Held, Held{Store: store, Keys: cfg.HoldKeys, Skipped: why})
		} else if !cfg.SkipHold {
			keys, capped := holdCap(store, cfg.HoldKeys)
			cfg.Progress("W3 %s, %d keys held", Redact(store), keys)
			r, err := held(ctx, store, keys, cfg.ServerPIDs[store], cfg.HoldSettle)
			if err != nil {
				return rep, &StoreError{Store: store, Err: err}
			}
			r.Capped = capped
			rep.Held = append(rep.Held, r)
		}
	}
	return rep, nil
}

// StoreError is an error of one store's part of a run (its probe or its
// cells), naming the store as Config.Stores gave it.
type StoreError struct {
	Store string
	Err   error
	// Probe: the store's first call failed (it could not be reached,
	// refused the credentials, …): the run made nothing there.
	Probe bool
}

func (e *StoreError) Error() string { return e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }

// probeTimeout bounds the probe of a store before its cells.
const probeTimeout = 15 * time.Second

// probe acquires and releases one key of its own on store before its
// cells, so that a store that cannot be reached ends the run with its
// error (dlock.ErrUnavailable) instead of cells that count errors and
// report zeros (a dlockd URL opens without dialling).
func probe(ctx context.Context, store string) error {
	lockers, closeAll, err := openLockers(ctx, store, 1)
	if err != nil {
		return err
	}
	defer closeAll()
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	ls, err := lockers[0].TryAcquire(pctx, fmt.Sprintf("bench:probe:%s", runID))
	if err != nil {
		return err
	}
	return release(ctx, ls)
}

// pairedBaselines runs the raw cells that store's W1 cell at n clients is
// read against (Config.PairedBaselines): raw Redis, and for an etcd or zk
// store its raw recipe. It returns their cycles/s (0 for a baseline the
// run has no server for).
func pairedBaselines(ctx context.Context, cfg Config, store string, n int) (rawRedis, rawRecipe float64, err error) {
	if cfg.RawRedisAddr != "" {
		cfg.Progress("W1 raw Redis, %d clients, before %s", n, Redact(store))
		r, err := RawRedisUncontended(ctx, cfg.RawRedisAddr, n, cfg.Duration)
		if err != nil {
			return 0, 0, err
		}
		rawRedis = r.CyclesPerSec
	}
	var recipe func(context.Context, string, int, time.Duration) (Uncontended, error)
	var addr string
	switch storeName(store) {
	case "etcd":
		recipe, addr = RawEtcdUncontended, cfg.RawEtcdEndpoint
	case "zk":
		recipe, addr = RawZKUncontended, cfg.RawZKAddr
	}
	if recipe != nil && addr != "" {
		cfg.Progress("W1 raw %s recipe, %d clients, before %s", storeName(store), n, Redact(store))
		r, err := recipe(ctx, addr, n, cfg.Duration)
		if err != nil {
			return 0, 0, err
		}
		rawRecipe = r.CyclesPerSec
	}
	return rawRedis, rawRecipe, nil
}

// runBaseline measures the machine's limits and the raw baselines (Redis,
// etcd, ZooKeeper) that cfg asks for.
func runBaseline(ctx context.Context, cfg Config) (Baseline, error) {
	var b Baseline
	if cfg.LimitsDir != "" {
		cfg.Progress("limits: loopback round trip, fdatasync in %s", cfg.LimitsDir)
		l, err := MeasureLimits(ctx, cfg.LimitsDir, 2000)
		if err != nil {
			return b, err
		}
		b.Limits = l
	}
	for _, n := range cfg.Clients {
		if cfg.RawEtcdEndpoint != "" {
			cfg.Progress("W1 raw etcd recipe (official client, no dlock), %d clients", n)
			r, err := RawEtcdUncontended(ctx, cfg.RawEtcdEndpoint, n, cfg.Duration)
			if err != nil {
				return b, err
			}
			b.RawEtcd = append(b.RawEtcd, r)
		}
		if cfg.RawZKAddr != "" {
			cfg.Progress("W1 raw ZooKeeper recipe (go-zookeeper, no dlock), %d clients", n)
			r, err := RawZKUncontended(ctx, cfg.RawZKAddr, n, cfg.Duration)
			if err != nil {
				return b, err
			}
			b.RawZK = append(b.RawZK, r)
		}
	}
	if cfg.RawRedisAddr == "" {
		return b, nil
	}
	for _, n := range cfg.Clients {
		cfg.Progress("W1 raw Redis (go-redis, no dlock), %d clients", n)
		r, err := RawRedisUncontended(ctx, cfg.RawRedisAddr, n, cfg.Duration)
		if err != nil {
			return b, err
		}
		b.RawRedis = append(b.RawRedis, r)
	}
	for _, n := range cfg.ContendedClients {
		cfg.Progress("W2 raw Redis (go-redis, no dlock), %d clients on one key", n)
		r, err := RawRedisContended(ctx, cfg.RawRedisAddr, n, cfg.Duration)
		if err != nil {
			return b, err
		}
		b.RawRedisContended = append(b.RawRedisContended, r)
	}
	return b, nil
}

// runID keeps keys of one run apart from earlier runs on the same store.
var runID = strconv.FormatInt(time.Now().UnixNano(), 36)

// releaseTimeout bounds one release.
const releaseTimeout = 10 * time.Second

// release releases ls even when ctx was cancelled (an interrupted bench
// still gives back what it holds), bounded by releaseTimeout.
func release(ctx context.Context, ls *dlock.Lease) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	return ls.Release(rctx)
}

// tryAcquire is l.TryAcquire of key, run to its end even when ctx is
// cancelled meanwhile (bounded by releaseTimeout): an attempt cut off
// midway may leave behind what the store granted.
func tryAcquire(ctx context.Context, l *dlock.Locker, key string, opts ...dlock.Option) (*dlock.Lease, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	return l.TryAcquire(actx, key, opts...)
}

// acquire is l.Acquire of a key nobody else takes, run to its end even
// when ctx is cancelled meanwhile, as tryAcquire.
func acquire(ctx context.Context, l *dlock.Locker, key string) (*dlock.Lease, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	return l.Acquire(actx, key)
}

func openLockers(ctx context.Context, store string, n int) ([]*dlock.Locker, func(), error) {
	lockers := make([]*dlock.Locker, 0, n)
	closeAll := func() {
		for _, l := range lockers {
			_ = l.Close()
		}
	}
	for range n {
		l, err := dlock.Open(ctx, store, dlock.WithTTL(30*time.Second), dlock.WithKeyClass("bench"),
			dlock.WithBackoff(time.Millisecond, 50*time.Millisecond))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		lockers = append(lockers, l)
	}
	return lockers, closeAll, nil
}

func uncontended(ctx context.Context, store string, n int, d time.Duration) (Uncontended, error) {
	lockers, closeAll, err := openLockers(ctx, store, n)
	if err != nil {
		return Uncontended{}, err
	}
	defer closeAll()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench:w1:%s:%d:%d", runID, n, i)
	}
	return cycles(ctx, store, n, d, func(i int) (time.Duration, error) {
		t0 := time.Now()
		ls, err := acquire(ctx, lockers[i], keys[i]) // an own key: free at once
		if err != nil {
			return 0, err
		}
		took := time.Since(t0)
		return took, release(ctx, ls)
	}), ctx.Err()
}

// cycles runs W1's loop: n clients at once, each calling cycle(i) in a
// loop until d has passed. cycle acquires its own key and releases it, and
// returns how long the acquisition took (0 when it failed) and its error,
// if any; a cycle without error counts.
func cycles(ctx context.Context, store string, n int, d time.Duration, cycle func(i int) (time.Duration, error)) Uncontended {
	var errs, done atomic.Int64
	lat := make([][]time.Duration, n)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				took, err := cycle(i)
				if took > 0 {
					lat[i] = append(lat[i], took)
				}
				switch {
				case err == nil:
					done.Add(1)
				case ctx.Err() == nil:
					errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	return Uncontended{
		Store: store, Clients: n, CyclesPerSec: float64(done.Load()) / elapsed.Seconds(),
		AcquireP50Us: pctUs(all, 0.50), AcquireP99Us: pctUs(all, 0.99), Errors: errs.Load(),
	}
}

func contended(ctx context.Context, store string, n int, d time.Duration) (Contended, error) {
	lockers, closeAll, err := openLockers(ctx, store, n)
	if err != nil {
		return Contended{}, err
	}
	defer closeAll()
	key := fmt.Sprintf("bench:w2:%s:%d", runID, n)
	h := newHandoffs(n)
	start := time.Now()
	end := start.Add(d)
	// The loops stop at end; waiters still queued then are cut off by stop.
	stopCtx, stop := context.WithDeadline(ctx, end.Add(2*time.Second))
	defer stop()
	var wg sync.WaitGroup
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				t0 := time.Now()
				ls, err := l.Acquire(stopCtx, key)
				if err != nil {
					if stopCtx.Err() == nil {
						h.errs.Add(1)
					}
					return
				}
				h.granted(i, t0, time.Now())
				if err := release(ctx, ls); err != nil {
					h.errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return h.result(store, time.Since(start)), ctx.Err()
}

// handoffs records W2's grants: the gap from each release to the next
// grant, the longest wait, and each client's grants (for the fairness
// index).
type handoffs struct {
	mu          sync.Mutex
	lastRelease time.Time
	gaps        []time.Duration
	longest     time.Duration
	perClient   []int
	errs        atomic.Int64
}

func newHandoffs(n int) *handoffs { return &handoffs{perClient: make([]int, n)} }

// granted records client i's grant at granted, for a wait begun at asked,
// and the release that follows at once (the caller releases next).
func (h *handoffs) granted(i int, asked, granted time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.lastRelease.IsZero() {
		h.gaps = append(h.gaps, granted.Sub(h.lastRelease))
	}
	h.longest = max(h.longest, granted.Sub(asked))
	h.perClient[i]++
	h.lastRelease = time.Now()
}

func (h *handoffs) result(store string, elapsed time.Duration) Contended {
	h.mu.Lock()
	defer h.mu.Unlock()
	total := 0
	for _, c := range h.perClient {
		total += c
	}
	return Contended{
		Store: store, Clients: len(h.perClient), HandoffsPerSec: float64(total) / elapsed.Seconds(),
		GapP50Us: pctUs(h.gaps, 0.50), GapP99Us: pctUs(h.gaps, 0.99),
		LongestWaitMs: float64(h.longest.Microseconds()) / 1000, Fairness: jain(h.perClient),
		Errors: h.errs.Load(),
	}
}

// jain is Jain's fairness index of the grants per client: (Σx)² / (n·Σx²),
// 1 when every client was granted as often, 1/n when one client took
// every grant; 0 when nobody was granted.
func jain(x []int) float64 {
	var sum, sq float64
	for _, v := range x {
		sum += float64(v)
		sq += float64(v) * float64(v)
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(x)) * sq)
}

func held(ctx context.Context, store string, keys, pid int, settle time.Duration) (Held, error) {
	const workers = 64
	lockers, closeAll, err := openLockers(ctx, store, workers)
	if err != nil {
		return Held{}, err
	}
	defer closeAll()
	r := Held{Store: store, Keys: keys}
	// A long TTL keeps heartbeats rare while the keys are held; Azure blob
	// leases last at most 60 s (the azblob driver refuses longer TTLs).
	holdTTL := 10 * time.Minute
	if strings.HasPrefix(store, "azblob:") {
		holdTTL = time.Minute
	}
	if pid > 0 {
		r.RSSBeforeMiB = rssMiB(pid)
	}
	leases := make([][]*dlock.Lease, workers)
	var errs atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < keys && ctx.Err() == nil; i += workers {
				// Not cut off by ctx: an attempt cancelled midway may leave
				// what the store granted (an etcd lease) until its TTL; the
				// loop stops at the next key instead.
				ls, err := tryAcquire(ctx, l, fmt.Sprintf("bench:w3:%s:%d", runID, i), dlock.WithTTL(holdTTL))
				if err != nil {
					errs.Add(1)
					continue
				}
				leases[w] = append(leases[w], ls)
			}
		}()
	}
	wg.Wait()
	r.AcquireSeconds = time.Since(start).Seconds()
	r.Errors = errs.Load()
	if pid > 0 {
		r.ServerRSSMiB = rssMiB(pid)
		if settle > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(settle):
				r.SettledMiB = rssMiB(pid)
				r.SettledRSSMiB = vmRSSMiB(pid)
			}
		}
	}
	for w := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, ls := range leases[w] {
				_ = release(ctx, ls)
			}
		}()
	}
	wg.Wait()
	return r, ctx.Err()
}

// rssMiB returns the memory of a server process and its descendants (the
// backends of PostgreSQL, say), in MiB: the sum of their proportional set
// sizes (PSS, from /proc/PID/smaps_rollup, so shared pages count once), or
// of their resident set sizes where PSS is not readable. 0 when pid cannot
// be read. Linux only.
func rssMiB(pid int) float64 {
	var kb float64
	for _, p := range processTree(pid) {
		if v := procField(fmt.Sprintf("/proc/%d/smaps_rollup", p), "Pss:"); v > 0 {
			kb += v
		} else {
			kb += procField(fmt.Sprintf("/proc/%d/status", p), "VmRSS:")
		}
	}
	return kb / 1024
}

// vmRSSMiB returns the resident set size (VmRSS) of a server process and
// its descendants, in MiB; 0 when pid cannot be read. Linux only.
func vmRSSMiB(pid int) float64 {
	var kb float64
	for _, p := range processTree(pid) {
		kb += procField(fmt.Sprintf("/proc/%d/status", p), "VmRSS:")
	}
	return kb / 1024
}

// procField reads a "Name:   123 kB" field from a /proc file, 0 on failure.
func procField(path, name string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err == nil {
				return f
			}
		}
	}
	return 0
}

// processTree returns pid and all its descendants, from /proc/*/stat.
func processTree(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command name "(...)": state, ppid, ...
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], child)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

func pctUs(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[int(float64(len(s)-1)*p)].Nanoseconds()) / 1000
}

// ParsePIDs parses "URL=PID" pairs.
func ParsePIDs(pairs []string) (map[string]int, error) {
	out := map[string]int{}
	for _, p := range pairs {
		i := strings.LastIndexByte(p, '=')
		if i < 0 {
			return nil, fmt.Errorf("bench: --pid %q: want URL=PID", p)
		}
		pid, err := strconv.Atoi(p[i+1:])
		if err != nil || pid <= 0 {
			return nil, errors.Join(fmt.Errorf("bench: --pid %q: bad PID", p), err)
		}
		out[p[:i]] = pid
	}
	return out, nil
}
