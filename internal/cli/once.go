package cli

// dlock run --once-per PERIOD --ledger DSN: run the command at most once
// per period across every node (recipe/once), the hooks that run.go calls.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx" for --ledger postgres://
	"github.com/spf13/pflag"
	_ "modernc.org/sqlite" // database/sql driver "sqlite" for --ledger sqlite:PATH

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/internal/supervise"
	"github.com/dlock-dev/dlock/recipe/once"
	"github.com/dlock-dev/dlock/recipe/once/redisledger"
	"github.com/dlock-dev/dlock/recipe/once/sqlledger"
)

// onceFlags are run's --once-per and --ledger.
type onceFlags struct {
	per    string // --once-per: day, hour, week, month or a duration; "" = off
	ledger string // --ledger DSN (env DLOCK_LEDGER)

	job    string      // KEY, the job's name (the lock key is once.Key(job))
	period once.Period // parsed --once-per
	l      closingLedger
	res    once.Result // Begin's result, for End
}

func (o *onceFlags) addFlags(fl *pflag.FlagSet) {
	fl.StringVar(&o.per, "once-per", "", "run the command at most once per period across all nodes: hour, day, week, month (UTC, or in a time zone such as \"day Europe/Paris\") or a duration such as 15m; needs --ledger. The lock key is once/KEY")
	fl.StringVar(&o.ledger, "ledger", "", "with --once-per: the run ledger, postgres://…, sqlite:PATH or redis://… (env DLOCK_LEDGER); the period is taken from its clock")
}

// on reports whether --once-per is given.
func (o *onceFlags) on() bool { return o != nil && o.per != "" }

// lockKey returns the key run locks: KEY, or once/KEY with --once-per.
func (o *onceFlags) lockKey(key string) string {
	if !o.on() {
		return key
	}
	o.job = key
	return once.Key(key)
}

// validate checks the --once-per flags before any store is called (exit 64).
func (o *onceFlags) validate(f *runFlags) error {
	if !o.on() {
		if o.ledger != "" {
			return fmt.Errorf("--ledger needs --once-per")
		}
		return nil
	}
	p, err := once.ParsePeriod(o.per)
	if err != nil && len(strings.Fields(o.per)) == 2 {
		// The period with a time zone: say which part is wrong.
		return fmt.Errorf("--once-per: %s", strings.TrimSuffix(strings.TrimPrefix(err.Error(), "once: "), ": "+dlock.ErrInvalidArgument.Error()))
	}
	if err != nil {
		return fmt.Errorf("--once-per %q: want hour, day, week, month (optionally with a time zone: \"day Europe/Paris\") or a duration of 1s to 366 days (e.g. 15m)", o.per)
	}
	if strings.HasSuffix(p.String(), " Local") {
		// Each node's Local is its own TZ: nodes could disagree on the window.
		return fmt.Errorf("--once-per %q: name the time zone (e.g. \"day Europe/Paris\"): Local may differ between nodes", o.per)
	}
	o.period = p
	if o.ledger == "" {
		o.ledger = os.Getenv("DLOCK_LEDGER")
	}
	switch {
	case o.ledger == "":
		return fmt.Errorf("--once-per needs --ledger (postgres://…, sqlite:PATH or redis://…), or DLOCK_LEDGER")
	case f.permits > 0:
		return fmt.Errorf("--once-per and --permits cannot be combined (once per period means one holder)")
	case f.resume.file != "":
		return fmt.Errorf("--once-per and --resume-file cannot be combined (a resumed lease would start its window's attempt a second time)")
	case f.failOpen:
		return fmt.Errorf("--once-per and --fail-open cannot be combined (a run without a lock cannot be once per period)")
	case len(o.job) > once.MaxJobBytes:
		return fmt.Errorf("--once-per: KEY is %d bytes, at most %d", len(o.job), once.MaxJobBytes)
	}
	return nil
}

// ledgerTimeout bounds opening the ledger and recording a start: a ledger
// that does not answer in time is unavailable (exit 69).
const ledgerTimeout = 15 * time.Second

// begin is called with the lease on once/KEY, before the command starts:
// it opens the ledger and records the start. stop says not to run the
// command: the window already ran (exit 0, result "done"), or the ledger
// failed (69 when it cannot be reached, 64 for a bad DSN, 70 when it
// refused the start for the fence).
func (o *onceFlags) begin(ctx context.Context, g *globals, f *runFlags, lease *dlock.Lease, res *runResult) (stop bool, code int, result string, err error) {
	if !o.on() || lease == nil {
		return false, 0, "", nil
	}
	// The ledger is asked under a bound (a server that accepts and never
	// answers would otherwise hold the lock for ever): the op timeout of
	// the store, at least ledgerTimeout.
	lctx, cancel := context.WithTimeout(ctx, ledgerTimeout)
	defer cancel()
	o.l, err = openLedger(lctx, o.ledger)
	if err != nil {
		code := ExitUnavailable
		if errors.Is(err, dlock.ErrInvalidArgument) {
			code = ExitUsage
		}
		return true, code, kindResult(code), fmt.Errorf("--ledger: %w", err)
	}
	r, err := once.Begin(lctx, o.l, lease, o.job, o.period, once.WithNode(f.holder))
	res.Window = r.Window.ID
	switch {
	case err == nil && r.Outcome == once.OutcomeDone:
		o.l.Close()
		rec := r.Record
		fmt.Fprintf(g.stderr, "dlock: run %q: already ran this %s (window %s, finished %s by %s, fence %d); not run\n",
			o.job, o.period, r.Window.ID, rec.FinishedAt.Format(time.RFC3339), quoteIfControl(rec.Node), rec.Fence)
		return true, ExitOK, "done", nil
	case err == nil:
		o.res = r
		if g.debug {
			fmt.Fprintf(g.stderr, "dlock: debug: once-per %s: window %s, attempt %d, fence %d, this node's clock %v off the ledger's\n",
				o.period, r.Window.ID, r.Record.Attempt, lease.Fence(), r.Skew.Round(time.Millisecond))
		}
		return false, 0, "", nil
	}
	o.l.Close()
	switch {
	case errors.Is(err, once.ErrStaleFence):
		return true, ExitLost, "lost", err
	case errors.Is(err, dlock.ErrInvalidArgument):
		return true, ExitUsage, "invalid", err
	}
	return true, ExitUnavailable, "unavailable", fmt.Errorf("--ledger: %w", err)
}

// end records the command's end in the ledger, before the lease is
// released: finished when it exited 0, else failed (retried by the next run
// in the window). A refused finish (another node started the window after
// this lease ended) is returned: run then exits 70. Any other ledger error
// is retried for 10 s, then a warning: the window stays started and the
// next run retries it.
func (o *onceFlags) end(g *globals, lease *dlock.Lease, r supervise.Result) error {
	if !o.on() || o.l == nil || o.res.Outcome != once.OutcomeRan {
		return nil
	}
	defer o.l.Close()
	var runErr error
	switch {
	case r.Reason == supervise.ReasonDeadline:
		runErr = fmt.Errorf("terminated at the lease's validity deadline")
	case r.Code != 0:
		runErr = fmt.Errorf("exit status %d", r.Code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Retried while the ledger fails (a window left started runs again).
	_, err := once.End(ctx, o.l, lease, o.res, runErr)
	for err != nil && !errors.Is(err, once.ErrStaleFence) && onceSleep(ctx, 250*time.Millisecond) {
		_, err = once.End(ctx, o.l, lease, o.res, runErr)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, once.ErrStaleFence):
		return err
	}
	fmt.Fprintf(g.stderr, "dlock: warning: could not record the end of %q in the ledger (%v); window %s stays started and the next run retries it\n",
		o.job, strings.TrimPrefix(err.Error(), "once: "), o.res.Window.ID)
	return nil
}

func kindResult(code int) string {
	if code == ExitUsage {
		return "invalid"
	}
	return "unavailable"
}

// env returns the command's environment additions: DLOCK_WINDOW (the
// window's ID) and DLOCK_ATTEMPT (1 for the first attempt of the window).
func (o *onceFlags) env() []string {
	if !o.on() || o.res.Outcome != once.OutcomeRan {
		return nil
	}
	return []string{"DLOCK_WINDOW=" + o.res.Window.ID, fmt.Sprintf("DLOCK_ATTEMPT=%d", o.res.Record.Attempt)}
}

// closingLedger is a ledger that --ledger opened.
type closingLedger interface {
	once.Ledger
	Close() error
}

// openLedger opens --ledger: redis://… or rediss://… (recipe/once/redisledger),
// else postgres://… or a SQLite file (recipe/once/sqlledger).
func openLedger(ctx context.Context, dsn string) (closingLedger, error) {
	if strings.HasPrefix(dsn, "redis://") || strings.HasPrefix(dsn, "rediss://") {
		l, err := redisledger.Open(ctx, dsn)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	l, err := sqlledger.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// onceSleep sleeps d and reports whether ctx is still alive.
func onceSleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
