package verify

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
)

// Config is one verification run.
type Config struct {
	// Faults is a comma-separated list of fault names (Faults), injected
	// together; "" or "none" runs without faults.
	Faults string
	// Duration is the whole run (default 12 s): a quiet fifth, the
	// faults for three fifths, a fifth to recover.
	Duration time.Duration
	// Clients (default 4) and Keys (default 2): the clients share the keys
	// so that they contend.
	Clients, Keys int
	// TTL is every lease's TTL (default 1 s).
	TTL time.Duration
	// Seed seeds the fault plan and the clients' choices (0: random).
	Seed uint64
	// Dir receives the register's database and porcupine's visualisation
	// (default: a temporary directory, removed unless a visualisation was
	// written).
	Dir string
	// Options are extra options for every client's Locker.
	Options []dlock.Option
	// Logf receives the fault plan as it runs (nil: discarded).
	Logf func(format string, args ...any)
}

func (c *Config) defaults() error {
	if c.Duration == 0 {
		c.Duration = 12 * time.Second
	}
	if c.Clients == 0 {
		c.Clients = 4
	}
	if c.Keys == 0 {
		c.Keys = 2
	}
	if c.TTL == 0 {
		c.TTL = time.Second
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	switch {
	case c.Duration < 0 || c.TTL < 0 || c.Clients < 0 || c.Keys < 0:
		return errors.New("verify: duration, TTL, clients and keys must not be negative")
	case c.TTL < MinTTL || c.TTL > MaxTTL:
		return fmt.Errorf("verify: TTL %v outside [%v, %v], the TTLs every driver takes", c.TTL, MinTTL, MaxTTL)
	case c.Duration < 5*c.TTL:
		return fmt.Errorf("verify: duration %v is shorter than 5 TTLs (%v): the faults would have no time", c.Duration, 5*c.TTL)
	case c.Clients < 2 || c.Clients > MaxClients:
		return fmt.Errorf("verify: %d clients: want 2 (for them to contend) to %d", c.Clients, MaxClients)
	case c.Keys > MaxKeys:
		return fmt.Errorf("verify: %d keys: want 1 to %d", c.Keys, MaxKeys)
	}
	for _, name := range splitFaults(c.Faults) {
		if _, err := lookupFault(name); err != nil {
			return err
		}
	}
	return nil
}

// Bounds of Config (Check).
const (
	// MinTTL and MaxTTL are the TTLs every driver takes (the driver
	// contract: 100 ms to 24 h).
	MinTTL = 100 * time.Millisecond
	MaxTTL = 24 * time.Hour
	// MaxClients and MaxKeys bound a run's clients and keys: more clients
	// than this make a history porcupine cannot check in reasonable time.
	MaxClients = 64
	MaxKeys    = 1000
)

// Check fills c's defaults (0 or "" take them) and returns an error for a
// setting out of bounds: a TTL outside [MinTTL, MaxTTL], a duration
// shorter than 5 TTLs, fewer than 2 or more than MaxClients clients, more
// than MaxKeys keys, or an unknown fault name. Run calls it; a caller may
// call it first to refuse bad input before it starts a store.
func (c *Config) Check() error { return c.defaults() }

// ErrInterrupted is returned (wrapped, with the context's error) by Run
// when its context ended before the run did: nothing was judged.
var ErrInterrupted = errors.New("verify: run interrupted")

// Result is one run: what ran, what was recorded, what the checkers found.
type Result struct {
	Store    string        `json:"store"`
	Faults   string        `json:"faults"`
	Duration time.Duration `json:"duration_ns"`
	Clients  int           `json:"clients"`
	Keys     int           `json:"keys"`
	TTL      time.Duration `json:"ttl_ns"`
	Seed     uint64        `json:"seed"`
	Findings *Findings     `json:"findings"`
	// Visualization is porcupine's HTML file for a history it did not
	// find linearizable ("" when it did).
	Visualization string   `json:"visualization,omitempty"`
	History       *History `json:"history"`
}

// Run runs cfg's clients against target under cfg's faults, heals every
// fault, and checks the history. It returns the error of Config.Check for
// bad settings, an error matching ErrUnsupportedFault when target cannot
// take a fault, one matching ErrInterrupted when ctx ends before the run
// does (nothing is judged then), or the store's error when it could not be
// opened; a store that misbehaves is a Result, not an error (one that
// granted nothing has Findings.Grants 0: it measured nothing).
func Run(ctx context.Context, cfg Config, target Target) (res *Result, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := Supports(target, cfg.Faults); err != nil {
		return nil, err
	}
	var plan []*fault
	for _, name := range splitFaults(cfg.Faults) {
		f, _ := lookupFault(name)
		plan = append(plan, f)
	}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "dlock-verify-")
		if err != nil {
			return nil, err
		}
		dir = d
		kept := false
		defer func() {
			if !kept {
				os.RemoveAll(dir)
			}
		}()
		defer func() { kept = res != nil && res.Visualization != "" }()
	}
	reg, err := OpenRegister(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer reg.Close()

	rec := newRecorder()
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5851f42d4c957f2d))
	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("verify:%x:%d", cfg.Seed&0xffff, i)
	}
	clients, err := openClients(ctx, cfg, target, rec, reg, keys)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range clients {
			c.locker.Close()
		}
	}()

	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.loop(runCtx)
		}()
	}
	e := &env{target: target, clients: clients, ttl: cfg.TTL, rng: rng, logf: cfg.Logf}
	began := time.Now()
	nemesisErr := nemesis(runCtx, e, plan, rec, cfg.Duration)
	wg.Wait()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%w after %v of %v: %w", ErrInterrupted, time.Since(began).Round(time.Millisecond), cfg.Duration, ctx.Err())
	}
	if nemesisErr != nil {
		return nil, nemesisErr
	}

	res = &Result{
		Store: target.Name(), Faults: strings.Join(splitFaults(cfg.Faults), ","), Duration: cfg.Duration,
		Clients: cfg.Clients, Keys: cfg.Keys, TTL: cfg.TTL, Seed: cfg.Seed, History: rec.history(),
	}
	lin := &Linearization{Path: filepath.Join(dir, "linearizability.html")}
	res.Findings, err = Check(res.History, lin)
	if err != nil {
		return nil, err
	}
	res.Visualization = lin.Written
	return res, nil
}

func openClients(ctx context.Context, cfg Config, target Target, rec *recorder, reg *Register, keys []string) ([]*client, error) {
	u, err := url.Parse(target.URL())
	if err != nil {
		return nil, fmt.Errorf("verify: store URL: %w", err)
	}
	open, err := driver.Lookup(u.Scheme)
	if err != nil {
		return nil, err
	}
	var clients []*client
	for i := range cfg.Clients {
		d, err := open(ctx, u)
		if err != nil {
			for _, c := range clients {
				c.locker.Close()
			}
			return nil, fmt.Errorf("verify: open %s: %w", u.Redacted(), err)
		}
		fd := dlocktest.NewFaultDriver(d, nil)
		opts := append([]dlock.Option{dlock.WithStoreName(target.Name()), dlock.WithTTL(cfg.TTL)}, cfg.Options...)
		clients = append(clients, &client{
			id: i, locker: dlock.New(Record(fd, rec.ops, i), opts...), faults: dlocktest.Faults(fd),
			rec: rec, reg: reg, keys: keys, ttl: cfg.TTL,
			rng: rand.New(rand.NewPCG(cfg.Seed+uint64(i)+1, uint64(i))),
		})
	}
	return clients, nil
}

// nemesis runs the fault plan in the middle three fifths of the run:
// every fault on for the longest of their durations, then healed, then
// quiet for 2 TTLs (prepare runs at its start, and at the run's start),
// again while the window has room; a fault marked once is injected in
// the first cycle only. Every fault is healed
// before it returns, with a context of its own so that the run's end does
// not skip a heal.
func nemesis(ctx context.Context, e *env, plan []*fault, rec *recorder, d time.Duration) error {
	if len(plan) == 0 {
		sleep(ctx, d)
		return nil
	}
	start := time.Now()
	end := start.Add(d * 4 / 5)
	var on float64
	for _, f := range plan {
		on = max(on, f.on)
	}
	onFor := time.Duration(on * float64(e.ttl))
	prepare := func(cycle int) error {
		for _, f := range plan {
			if f.prepare != nil && (!f.once || cycle == 0) {
				if err := f.prepare(ctx, e); err != nil {
					return fmt.Errorf("verify: %s: prepare: %w", f.name, err)
				}
			}
		}
		return nil
	}
	if err := prepare(0); err != nil {
		return err
	}
	sleep(ctx, d/5)
	for cycle := 0; ctx.Err() == nil; cycle++ {
		if cycle > 0 {
			if err := prepare(cycle); err != nil {
				return err
			}
			sleep(ctx, 2*e.ttl)
			if ctx.Err() != nil || time.Until(end) < onFor {
				break
			}
		}
		type injected struct {
			span int
			heal func(context.Context) error
		}
		var on []injected
		var injErr error
		for _, f := range plan {
			if f.once && cycle > 0 {
				continue
			}
			at := rec.now()
			heal, note, err := f.inject(ctx, e)
			if err != nil {
				injErr = fmt.Errorf("verify: inject %s: %w", f.name, err)
				break
			}
			e.logf("verify: %s on %s", f.name, note)
			on = append(on, injected{rec.fault(FaultSpan{Name: f.name, Start: at, Note: note}), heal})
		}
		if injErr == nil {
			sleep(ctx, onFor)
		}
		for i := len(on) - 1; i >= 0; i-- {
			hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
			err := on[i].heal(hctx)
			cancel()
			note := ""
			if err != nil {
				note = "heal failed: " + err.Error()
				injErr = errors.Join(injErr, fmt.Errorf("verify: heal: %w", err))
			}
			rec.healed(on[i].span, rec.now(), note)
		}
		e.logf("verify: healed")
		if injErr != nil {
			return injErr
		}
	}
	<-ctx.Done()
	return nil
}
