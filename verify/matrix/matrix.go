// Package matrix runs dlock verify's store × fault grid: it starts every
// store the verifier can fault (real servers from testservers and
// servertest, on loopback, stopped by PID), runs verify.Run for each
// fault the store can take, judges each cell against what the store
// promises, and writes docs/GUARANTEES.md and the HTML report.
//
// A cell's verdict:
//
//   - safe: no checker failed and no two holders acted at once;
//   - safe with fencing: a client fault (a pause, a clock jump) made two
//     holders act at once, as it does on every lease-based store, and the
//     fenced register refused the stale holder's late writes: no stale
//     write accepted, no early grant by the store;
//   - unsafe, as documented: a checker failed where the store says it can
//     (Redis failover and lossy restarts; Redlock's lossy restart);
//   - UNSAFE: a checker failed where the store promises it cannot: a bug
//     to fix or report, and `make verify` fails;
//   - n/a: the store cannot take the fault here (the reason is given).
package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server/servertest"
	"github.com/dlock-dev/dlock/verify"

	// The drivers of the stores in the grid.
	_ "github.com/dlock-dev/dlock/drivers/dlockddriver"
	_ "github.com/dlock-dev/dlock/drivers/etcddriver"
	_ "github.com/dlock-dev/dlock/drivers/pgdriver"
	_ "github.com/dlock-dev/dlock/drivers/redisdriver"
	_ "github.com/dlock-dev/dlock/drivers/redlockdriver"
	_ "github.com/dlock-dev/dlock/drivers/zkdriver"
)

// Store is one row group of the grid.
type Store struct {
	Name string
	// Doc says what the store is here.
	Doc string
	// Start starts it; h stops it.
	Start func(h *testservers.Harness, seed uint64) verify.Target
	// MayFail names the faults under which the store documents that it can
	// grant twice or lose fences, with the reason.
	MayFail map[string]string
	// Short is the faults of the short matrix (make test).
	Short []string
	// OptIn, when not "", keeps the store out of a grid that does not name
	// it in Options.Stores (the default grid, make verify, make test),
	// and says why: its runs take too long for the default.
	OptIn string
	// TTL is the shortest TTL the store's runs can use (0: any, the
	// matrix's): a store whose expiry or write rate cannot follow the
	// matrix's TTL runs at this one (see runTTL).
	TTL time.Duration
}

// runTTL returns the TTL and the duration of s's runs under o (after
// o.defaults): the longer of o.TTL and s.TTL, and o.Duration scaled by the
// same factor, so that the fault cycles, whose lengths are in TTLs, fit the
// run as they do at o.TTL.
func (s Store) runTTL(o Options) (ttl, d time.Duration) {
	if s.TTL <= o.TTL || o.TTL <= 0 {
		return max(o.TTL, s.TTL), o.Duration
	}
	return s.TTL, time.Duration(float64(o.Duration) * float64(s.TTL) / float64(o.TTL))
}

// RunTTL returns the TTL and duration a run on the managed store name
// uses when asked for ttl and d: the store's own minimum TTL when it is
// longer than ttl, with d scaled by the same factor (see Store.TTL); ttl
// and d unchanged for a store without one, or not in Stores.
func RunTTL(name string, ttl, d time.Duration) (time.Duration, time.Duration) {
	for _, s := range Stores {
		if s.Name == name {
			return s.runTTL(Options{TTL: ttl, Duration: d})
		}
	}
	return ttl, d
}

// Stores is the grid's stores, in report order.
var Stores = []Store{
	{Name: "dlockd", Doc: "one dlockd process, fsync on", Short: []string{"kill", "store-clock-jump"},
		MayFail: map[string]string{
			"restart-lossy":    "a disk that lies about fsync loses acknowledged grants and Raft log entries: dlockd forgets the grants and issues their fences (log indexes) again, and promises nothing then (fences survive restarts because every batch is fsynced before it is answered)",
			"store-clock-jump": dlockdClockJump,
		},
		Start: func(h *testservers.Harness, seed uint64) verify.Target { return startDlockd(h, 1, seed) }},
	{Name: "dlockd3", Doc: "three dlockd processes (Raft), fsync on, every link through a proxy", Short: []string{"partition", "leader-kill"},
		MayFail: map[string]string{"store-clock-jump": dlockdClockJump},
		Start:   func(h *testservers.Harness, seed uint64) verify.Target { return dlockdSet{startDlockd(h, 3, seed)} }},
	{Name: "redis", Doc: "one redis-server, AOF with appendfsync everysec", Short: []string{"pause"},
		MayFail: map[string]string{"restart-lossy": "a Redis that restarts without its data forgets every lock and its fence counter"},
		Start:   func(h *testservers.Harness, seed uint64) verify.Target { return startRedis(h, seed) }},
	{Name: "redis-failover", Doc: "a primary and an asynchronous replica (replication delayed by TTL/4 to TTL/2), promoted with REPLICAOF NO ONE", Short: []string{"failover"},
		MayFail: map[string]string{"failover": "replication is asynchronous: the promoted replica lacks the last grants and fences, so it issues a fence again, and the register cannot tell two holders of one fence apart"},
		Start: func(h *testservers.Harness, seed uint64) verify.Target {
			return startRedisFailover(h, seed, 400*time.Millisecond, 1, "redis-failover", "")
		}},
	{Name: "redis-failover-wait", Doc: "a primary and two asynchronous replicas (replication delayed by TTL/4 to TTL/2), the driver's wait_replicas=1 (every grant and renewal acknowledged by one replica before it is reported); the replica with the most of the stream is promoted and the other follows it", Short: []string{"failover"},
		Start: func(h *testservers.Harness, seed uint64) verify.Target {
			return startRedisFailover(h, seed, 400*time.Millisecond, 2, "redis-failover-wait", "wait_replicas=1")
		}},
	{Name: "redlock", Doc: "Redlock on five redis-servers (AOF everysec), each behind a proxy", Short: []string{"restart-lossy"},
		MayFail: map[string]string{"restart-lossy": "a node restarted without its data lets a second client win a majority (Redlock's known weakness)"},
		Start:   func(h *testservers.Harness, seed uint64) verify.Target { return startRedlock(h, seed) }},
	{Name: "etcd", Doc: "one etcd", Short: []string{"reply-loss"},
		MayFail: map[string]string{"restart-lossy": "a disk that lies about fsync loses acknowledged grants and revisions: etcd hands the lost revisions out again as fences, and promises nothing then (its revision survives restarts because the WAL is fsynced)"},
		Start:   func(h *testservers.Harness, seed uint64) verify.Target { return startEtcd(h, seed) }},
	{Name: "etcd3", Doc: "three etcd members, every member-to-member link through a gate that can cut it", Short: []string{"leader-pause"},
		Start: func(h *testservers.Harness, seed uint64) verify.Target { return startEtcdCluster(h, seed) }},
	{Name: "zookeeper", Doc: "one ZooKeeper (standalone)", Short: []string{"blackhole"},
		MayFail: map[string]string{"restart-lossy": "a disk that lies about fsync loses acknowledged zxids: ZooKeeper refuses the clients that saw them (until its zxid passes theirs) but hands the same zxids out again as fences to new clients, and promises nothing then (the test server runs with forceSync=no, so a power cut would do the same without a lying disk)"},
		Start:   func(h *testservers.Harness, seed uint64) verify.Target { return startZooKeeper(h, seed) }},
	{Name: "zookeeper3", Doc: "three ZooKeeper members, every member-to-member link through a proxy", Short: []string{"partition"},
		Start: func(h *testservers.Harness, seed uint64) verify.Target { return startZooKeeperEnsemble(h, seed) }},
	{Name: "postgres", Doc: "one PostgreSQL", Short: []string{"kill"},
		Start: func(h *testservers.Harness, seed uint64) verify.Target { return startPostgres(h, seed) }},
	{Name: "consul", Doc: "one Consul server agent (Raft on disk, session_ttl_min 100 ms)", Short: []string{"blackhole"},
		Start: func(h *testservers.Harness, seed uint64) verify.Target { return startConsul(h, seed) }},
	{Name: "dynamodb", Doc: "dynalite, an emulator of DynamoDB's API on LevelDB", Short: []string{"reply-loss"},
		Start: func(h *testservers.Harness, seed uint64) verify.Target { return startDynamo(h, seed) }},
	{Name: "gcs", Doc: "fake-gcs-server, an emulator of Cloud Storage's JSON API, in the verifier's process (objects in memory: no process to kill)", Short: []string{"reply-loss"},
		TTL:   gcsTTL,
		Start: func(h *testservers.Harness, seed uint64) verify.Target { return startGCS(h, seed) }},
	{Name: "azblob", Doc: "Azurite's blob service, the Azure Storage emulator (metadata saved to disk every 5 s)", Short: []string{"reply-loss"},
		TTL:     azblobTTL,
		OptIn:   "a blob lease lasts at least 15 s, so its runs are 15× as long: its column takes about 15 minutes (dlock verify matrix --stores azblob)",
		MayFail: map[string]string{"kill": "Azurite keeps its metadata in memory and saves it every 5 s, and forgets its leases when it restarts: a kill -9 of the emulator can lose recent fences and grants (the emulator's weakness, not Azure's)"},
		Start:   func(h *testservers.Harness, seed uint64) verify.Target { return startAzblob(h, seed) }},
}

// dlockdClockJump is why dlockd may grant early under store-clock-jump.
const dlockdClockJump = "dlockd ends a grant by its leader's monotonic clock and trusts that clock to run at the holder's rate (within the drift, 1% of the TTL + 2 ms): a leader whose clock jumps forward ends grants early and hands the key on while the holder still counts on it; fences still grow, so the register refuses the old holder (server/doc.go, Clocks)"

// Options bounds a matrix run.
type Options struct {
	// Short runs each store's Short faults only (the make test matrix).
	Short bool
	// Stores and Faults, when not empty, restrict the grid by name.
	Stores, Faults []string
	// Runs is the number of runs per cell (default 1; the failover cell
	// always gets at least 3).
	Runs int
	// Duration, Clients, Keys and TTL are each run's (defaults 12 s,
	// 4, 2, 1 s; Short: 8 s).
	Duration      time.Duration
	Clients, Keys int
	TTL           time.Duration
	// Seed makes the grid repeatable (0: time-based).
	Seed uint64
	// Results, when not "", receives one JSON file per run.
	Results string
	// Logf receives progress.
	Logf func(format string, args ...any)
}

// Cell is one store × fault of the grid.
type Cell struct {
	Store, Fault string
	Runs         []*verify.Result
	// Verdict is the cell's judgement (see the package doc); Reason
	// explains n/a, an expected failure, or an error.
	Verdict, Reason string
}

// Verdicts.
const (
	Safe           = "safe"
	SafeFenced     = "safe with fencing"
	UnsafeExpected = "unsafe, as documented"
	Unsafe         = "UNSAFE"
	NotApplicable  = "n/a"
	Failed         = "error"
)

// Report is a whole grid.
type Report struct {
	Started  time.Time
	Elapsed  time.Duration
	Options  Options
	Stores   []Store
	Cells    []*Cell
	Problems []string // cells that fail make verify
}

// Check fills o's defaults and returns an error for a setting out of
// bounds (see verify.Config.Check: TTL, clients, keys; runs below 0) or a
// store or fault name that is not in the grid, before anything starts.
func (o *Options) Check() error {
	if o.Runs < 0 {
		return fmt.Errorf("matrix: %d runs per cell: want at least 1", o.Runs)
	}
	o.defaults()
	cfg := verify.Config{Duration: o.Duration, Clients: o.Clients, Keys: o.Keys, TTL: o.TTL, Seed: 1}
	if err := cfg.Check(); err != nil {
		return err
	}
	for _, n := range o.Stores {
		if !Has(n) {
			return fmt.Errorf("matrix: no store %q (stores: %s)", n, strings.Join(StoreNames(), ", "))
		}
	}
	var fs []string
	for _, f := range verify.Faults() {
		fs = append(fs, f.Name)
	}
	for _, n := range o.Faults {
		if !slices.Contains(fs, n) {
			return fmt.Errorf("matrix: no fault %q (faults: %s)", n, strings.Join(fs, ", "))
		}
	}
	return nil
}

// Cleanup removes what the grid's runs left for the whole process: the
// dlockd binary servertest built. Call it once, when done with the grid.
func Cleanup() { servertest.Cleanup() }

func (o *Options) defaults() {
	if o.Runs == 0 {
		o.Runs = 1
	}
	if o.Duration == 0 {
		o.Duration = 12 * time.Second
		if o.Short {
			o.Duration = 8 * time.Second
		}
	}
	if o.Clients == 0 {
		o.Clients = 4
	}
	if o.Keys == 0 {
		o.Keys = 2
	}
	if o.TTL == 0 {
		o.TTL = time.Second
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

func pick(names []string, name string) bool {
	if len(names) == 0 {
		return true
	}
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// Run runs the grid. A store that cannot start makes its cells "error"
// (and the report's Problems), not Run's error; Run fails only when ctx
// ends or Results cannot be written.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	rep := &Report{Started: time.Now(), Options: o}
	if o.Results != "" {
		if err := os.MkdirAll(o.Results, 0o755); err != nil {
			return nil, err
		}
	}
	for si, s := range Stores {
		if !pick(o.Stores, s.Name) || (s.OptIn != "" && len(o.Stores) == 0) {
			continue
		}
		rep.Stores = append(rep.Stores, s)
		var faults []string
		for _, f := range verify.Faults() {
			if pick(o.Faults, f.Name) && (!o.Short || pick(s.Short, f.Name)) {
				faults = append(faults, f.Name)
			}
		}
		if ctx.Err() != nil {
			return rep, fmt.Errorf("%w: %w", verify.ErrInterrupted, ctx.Err())
		}
		if err := runStore(ctx, o, rep, s, uint64(si), faults); err != nil {
			return rep, err
		}
		if ctx.Err() != nil {
			return rep, fmt.Errorf("%w: %w", verify.ErrInterrupted, ctx.Err())
		}
	}
	rep.Elapsed = time.Since(rep.Started)
	for _, c := range rep.Cells {
		if c.Verdict == Unsafe || c.Verdict == Failed {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s × %s: %s: %s", c.Store, c.Fault, c.Verdict, c.Reason))
		}
	}
	return rep, nil
}

func runStore(ctx context.Context, o Options, rep *Report, s Store, si uint64, faults []string) error {
	h := testservers.NewHarness(o.Logf)
	defer func() { h.Close() }() // the harness of the last run (failover starts one per run)
	var target verify.Target
	start := time.Now()
	err := h.Run(func() { target = s.Start(h, o.Seed+si) })
	if err != nil {
		for _, f := range faults {
			rep.Cells = append(rep.Cells, &Cell{Store: s.Name, Fault: f, Verdict: Failed, Reason: "the store did not start: " + err.Error()})
		}
		return nil
	}
	defer func() { target.Close() }()
	o.Logf("matrix: %s started in %v", s.Name, time.Since(start).Round(time.Millisecond))
	for fi, f := range faults {
		cell := &Cell{Store: s.Name, Fault: f}
		rep.Cells = append(rep.Cells, cell)
		if err := verify.Supports(target, f); err != nil {
			cell.Verdict, cell.Reason = NotApplicable, strings.TrimPrefix(err.Error(), verify.ErrUnsupportedFault.Error()+": ")
			continue
		}
		runs := o.Runs
		if f == "failover" {
			runs = max(runs, 3)
		}
		for r := range runs {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if r > 0 && f == "failover" {
				// A failover cannot be undone: a fresh primary and replica per run.
				target.Close()
				h.Close()
				h = testservers.NewHarness(o.Logf)
				if err := h.Run(func() { target = s.Start(h, o.Seed+si+uint64(r)*1000) }); err != nil {
					cell.Verdict, cell.Reason = Failed, "the store did not restart: "+err.Error()
					break
				}
			}
			ttl, dur := s.runTTL(o)
			cfg := verify.Config{
				Faults: f, Duration: dur, Clients: o.Clients, Keys: o.Keys, TTL: ttl,
				Seed: o.Seed + si*100 + uint64(fi)*10 + uint64(r) + 1, Logf: o.Logf,
			}
			res, err := verify.Run(ctx, cfg, target)
			if errors.Is(err, verify.ErrInterrupted) {
				return err
			}
			if err != nil {
				cell.Verdict, cell.Reason = Failed, err.Error()
				break
			}
			cell.Runs = append(cell.Runs, res)
			o.Logf("matrix: %s × %s run %d: grants %d, writes %d, double grants %d (store %d), fence violations %d, stale writes accepted %d / refused %d, linearizable %s",
				s.Name, f, r+1, res.Findings.Grants, res.Findings.WritesAccepted, res.Findings.DoubleGrants, res.Findings.EarlyGrants, res.Findings.FenceViolations,
				res.Findings.StaleWritesAccepted, res.Findings.StaleWritesRefused, res.Findings.Linearizable)
			if o.Results != "" {
				if err := writeJSON(filepath.Join(o.Results, fmt.Sprintf("%s-%s-%d.json", s.Name, f, r+1)), res); err != nil {
					return err
				}
			}
		}
		if cell.Verdict == "" {
			judge(cell, s)
		}
	}
	return nil
}

// judge sets a cell's verdict from its runs.
func judge(c *Cell, s Store) {
	unsafe, overlap := false, false
	for i, r := range c.Runs {
		if r.Findings.Grants == 0 {
			c.Verdict, c.Reason = Failed, fmt.Sprintf("run %d granted nothing in %v (%d acquisitions failed): it measured nothing", i+1, r.Duration, r.Findings.FailedAcquires)
			return
		}
		unsafe = unsafe || r.Findings.Unsafe()
		overlap = overlap || r.Findings.DoubleGrants > 0
	}
	switch {
	case len(c.Runs) == 0:
		c.Verdict, c.Reason = Failed, "no run"
		return
	case unsafe && s.MayFail[c.Fault] != "":
		c.Verdict, c.Reason = UnsafeExpected, s.MayFail[c.Fault]
	case unsafe:
		c.Verdict, c.Reason = Unsafe, "a checker failed where the store promises safety"
	case overlap:
		c.Verdict = SafeFenced
	default:
		c.Verdict = Safe
	}
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Err returns an error listing the cells that fail make verify, or nil.
func (r *Report) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	return errors.New("matrix: " + strings.Join(r.Problems, "; "))
}

// StoreNames returns the names of the grid's stores, in report order.
func StoreNames() []string {
	names := make([]string, len(Stores))
	for i, s := range Stores {
		names[i] = s.Name
	}
	return names
}

// Has reports whether name is a store of the grid (Stores).
func Has(name string) bool { return slices.Contains(StoreNames(), name) }

// Start starts the grid's store called name (Stores) for a run of its
// own and returns it with the function that stops everything it started.
func Start(name string, seed uint64, logf func(format string, args ...any)) (verify.Target, func() error, error) {
	for _, s := range Stores {
		if s.Name != name {
			continue
		}
		h := testservers.NewHarness(logf)
		var target verify.Target
		if err := h.Run(func() { target = s.Start(h, seed) }); err != nil {
			h.Close()
			return nil, nil, err
		}
		return target, h.Close, nil
	}
	return nil, nil, fmt.Errorf("matrix: no store %q (stores: %s)", name, strings.Join(StoreNames(), ", "))
}
