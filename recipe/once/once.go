// Package once runs a job at most once per period (hour, day, week, month
// or a fixed duration) across every node that tries it, the way ShedLock
// guards scheduled tasks, without ShedLock's two failures: clock skew and
// crashed runs.
//
//	res, err := once.Run(ctx, locker, ledger, "nightly-report", once.Daily,
//		func(ctx context.Context, a once.Attempt) error {
//			return report(ctx, a.Window.ID, a.Fence) // stop when ctx ends
//		})
//
// # How it works
//
// Run reads the time from the Ledger (Ledger.Now: PostgreSQL's clock for
// the SQL ledger), takes the Period's window of that time, and returns
// OutcomeDone at once when the ledger records the window as finished.
// Otherwise it acquires the job's lock key (Key(job)) on the store behind
// the dlock.Locker, records the attempt's start in the ledger with the
// lease's fence, runs fn under the lease, and records the finish with the
// same fence. The ledger's rules (see Ledger) make each step conditional on
// the fence: a start needs a fence greater than the recorded one, a finish
// the recorded one exactly.
//
// # Clock skew (the ShedLock bug)
//
// A node's own clock never decides the window. ShedLock takes "now" from
// each node (unless told to use the database's time): a node whose clock
// runs ahead locks, runs the job and releases before the others' midnight,
// and a node whose clock lags then runs it again; holding the lock "at
// least for" a while helps only when that exceeds the skew. Here the
// window comes from the ledger's clock, the same for every node, so nodes
// whose clocks differ by any amount agree on it; a node's clock
// (WithClock) is only compared with the ledger's (Result.Skew, and
// WithMaxSkew to refuse to run on a node whose clock is off).
//
// # Crashed and paused runs
//
// A window whose latest attempt is Started (its node crashed, or was
// paused and lost its lease) is retried by the next Run, which can acquire
// the job's lock only once that lease was released or expired on the store
// (the lock, not a clock, says the attempt is over). The retry's fence is
// greater, so the ledger then refuses the old attempt's late finish, or a
// late start of a node that was paused before it recorded its start
// (ErrStaleFence). A Finished window never runs again; a Failed one (fn
// returned an error) is retried by the next Run in the window. A window
// that ends while its attempt is Started is not retried after it: the next
// Run is for the next window.
//
// fn runs under the lease's context: it is cancelled when the lease is
// lost, and fn should pass Attempt.Fence to the resources it writes
// (package fence) so that a paused attempt cannot write after its
// successor. "At most once" is then exact for fenced writes; an unfenced
// side effect of an attempt that crashed midway may happen again on the
// retry, as with any lock.
//
// # Ledgers
//
//   - recipe/once/sqlledger: a table in PostgreSQL (the server's clock) or
//     in a SQLite file (the clock of the host that shares it), written
//     through fence/fencesql;
//   - recipe/once/redisledger: hashes in Redis (the server's TIME), as
//     durable as the Redis (use appendonly);
//   - MemLedger: in-process, for tests and examples.
//
// The dlock CLI uses them: dlock run --once-per day --ledger URL.
//
// # Stores
//
// Any dlock store that issues fences works (all of this module's); a lease
// without a fence (WithFailOpen's degraded lease, a store without fences) is
// refused with ErrUnsupported, as running unlocked would break the
// guarantee. Fences are compared only between grants of the job's one lock
// key: use one lock store per job.
package once

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/dlock-dev/dlock"
)

// KeyPrefix is the prefix of the lock key of every job: Key(job).
const KeyPrefix = "once/"

// MaxJobBytes is the longest job name, in bytes.
const MaxJobBytes = 256

// Key returns the lock key of job's runs: "once/" + job. One key per job
// (not per window) serializes its runs and makes the fences of all its
// windows comparable.
func Key(job string) string { return KeyPrefix + job }

// Outcome says what Run did.
type Outcome int

const (
	// OutcomeNone: Run did not get to a decision (it returned an error
	// before acquiring the lock, or it could not start an attempt).
	OutcomeNone Outcome = iota
	// OutcomeRan: fn ran in this call (Result.Record says whether it
	// finished, and Run's error is fn's).
	OutcomeRan
	// OutcomeDone: the window had already finished, here or on another
	// node; fn did not run.
	OutcomeDone
	// OutcomeBusy: with NoWait, another node holds the job's lock (it is
	// running the job); fn did not run. The error matches
	// dlock.ErrNotAcquired.
	OutcomeBusy
)

// String returns "ran", "done", "busy" or "none".
func (o Outcome) String() string {
	switch o {
	case OutcomeRan:
		return "ran"
	case OutcomeDone:
		return "done"
	case OutcomeBusy:
		return "busy"
	}
	return "none"
}

// Attempt is what fn is given: the window it runs for and its lease.
type Attempt struct {
	Job    string
	Window Window
	// Fence is the lease's fencing token: pass it to what fn writes.
	Fence uint64
	// Number counts the attempts of this window, 1 for the first (more
	// after a crash or a failure).
	Number int
	// Lease is the job's lease (Key(job)); Run releases it when fn returns.
	Lease *dlock.Lease
}

// Result is what Run did.
type Result struct {
	Outcome Outcome
	// Window is the window Run decided on, from the ledger's clock.
	Window Window
	// Record is the ledger's record of the window after the call (zero when
	// there is none).
	Record Record
	// Skew is the node's clock (WithClock) minus the ledger's, measured
	// when Run read the ledger's clock; positive when the node is ahead.
	Skew time.Duration
}

// Option configures Run, Peek and Begin. A nil Option is ignored.
type Option func(*options)

type options struct {
	lockOpts []dlock.Option
	node     string
	clock    func() time.Time
	maxSkew  time.Duration
	noWait   bool
}

// WithLockOptions passes opts to the acquisition of the job's lock (TTL,
// holder description, backoff ...). Zero value: the Locker's defaults.
// WithFailOpen is refused (see the package doc).
func WithLockOptions(opts ...dlock.Option) Option {
	return func(o *options) {
		for _, lo := range opts {
			if lo != nil { // the root package would call it
				o.lockOpts = append(o.lockOpts, lo)
			}
		}
	}
}

// WithNode names this node in the ledger's records (at most 256 bytes).
// Zero value: "HOSTNAME pid PID".
func WithNode(name string) Option { return func(o *options) { o.node = name } }

// WithClock sets the node's own clock, which Run only compares with the
// ledger's (Result.Skew, WithMaxSkew); it never decides the window. Zero
// value: time.Now. Tests inject skewed clocks with it.
func WithClock(now func() time.Time) Option { return func(o *options) { o.clock = now } }

// WithMaxSkew makes Run refuse, with an error wrapping ErrClockSkew, to run
// on a node whose clock (WithClock) differs from the ledger's by more than
// d, for jobs whose fn trusts the local clock. Zero value (and d ≤ 0): no
// limit.
func WithMaxSkew(d time.Duration) Option { return func(o *options) { o.maxSkew = d } }

// NoWait makes Run try the job's lock once: when another node holds it, Run
// returns OutcomeBusy and an error matching dlock.ErrNotAcquired instead of
// waiting for it. Without NoWait, Run waits for the lock until ctx ends, so
// it returns only once the window has run (here or elsewhere) or failed.
func NoWait() Option { return func(o *options) { o.noWait = true } }

// Run runs fn at most once per window of period for job, across every node
// that calls Run with the same job, ledger and lock store (see the package
// doc for the algorithm, clock skew and crashed runs). It is Peek, the
// acquisition of Key(job), Begin, fn and End.
//
// fn gets a context that ends when ctx ends or the lease is lost (cause
// dlock.ErrLeaseLost), and the Attempt. Run releases the lease when fn
// returns; a panic in fn propagates, after the release, leaving the
// window Started (retried by the next Run).
//
// It returns:
//   - OutcomeRan with fn's error (nil when the window is now Finished);
//     when the ledger refuses the finish because the lease was lost and
//     another node started the window meanwhile, the error matches
//     ErrStaleFence and dlock.ErrLeaseLost (if the lease was lost), joined
//     with fn's;
//   - OutcomeDone and nil when the window had already finished;
//   - OutcomeBusy and an error matching dlock.ErrNotAcquired (NoWait);
//   - OutcomeNone and an error: matching dlock.ErrInvalidArgument for a
//     nil Locker, Ledger or fn, an invalid job (empty, over MaxJobBytes, or
//     whose Key is not a valid lock key), the zero Period, or a node name
//     over 256 bytes; wrapping ErrClockSkew (WithMaxSkew); matching
//     dlock.ErrUnsupported for a lease without a fence; wrapping
//     ErrStaleFence when the ledger refused the start (the lease's fence is
//     not greater than the recorded one: the lease was lost before the
//     start, or the store's fences went back); the acquisition's errors
//     (ctx, ErrUnavailable ...); the ledger's errors, wrapped.
func Run(ctx context.Context, l *dlock.Locker, ledger Ledger, job string, period Period, fn func(ctx context.Context, a Attempt) error, opts ...Option) (Result, error) {
	o := newOptions(opts)
	switch {
	case l == nil:
		return Result{}, invalid("nil Locker")
	case fn == nil:
		return Result{}, invalid("nil fn")
	}
	// Without the lock first: the common case on all but one node.
	res, err := Peek(ctx, ledger, job, period, opts...)
	if err != nil || res.Outcome == OutcomeDone {
		return res, err
	}
	key := Key(job)
	var lease *dlock.Lease
	if o.noWait {
		lease, err = l.TryAcquire(ctx, key, o.lockOpts...)
	} else {
		lease, err = l.Acquire(ctx, key, o.lockOpts...)
	}
	if err != nil {
		if errors.Is(err, dlock.ErrNotAcquired) {
			res.Outcome = OutcomeBusy
		}
		return res, fmt.Errorf("once: %q: %w", job, err)
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	res, err = Begin(ctx, ledger, lease, job, period, opts...)
	if err != nil || res.Outcome != OutcomeRan {
		return res, err
	}
	runErr := call(ctx, lease, fn, Attempt{Job: job, Window: res.Window, Fence: lease.Fence(), Number: res.Record.Attempt, Lease: lease})
	// The finish is recorded even when ctx has ended (fn's work is done),
	// retried while the ledger fails, for up to finishTimeout: a window
	// left Started would run again.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	res, err = endRetrying(fctx, ledger, lease, res, runErr)
	return res, errors.Join(runErr, err)
}

// endRetrying is End, retried with backoff (50 ms doubling to 1 s) until
// it succeeds, the ledger refuses (ErrStaleFence) or ctx ends.
func endRetrying(ctx context.Context, ledger Ledger, lease *dlock.Lease, res Result, runErr error) (Result, error) {
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		r, err := End(ctx, ledger, lease, res, runErr)
		if err == nil || errors.Is(err, ErrStaleFence) || errors.Is(err, dlock.ErrInvalidArgument) {
			return r, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return r, err
		case <-t.C:
		}
	}
}

// Peek reads the ledger's clock and the record of job's window at that
// time, without the lock. Result.Outcome is OutcomeDone when the window has
// finished, else OutcomeNone (Record is zero when the window has no record).
// Errors are Run's for invalid input, ErrClockSkew and the ledger's.
func Peek(ctx context.Context, ledger Ledger, job string, period Period, opts ...Option) (Result, error) {
	o := newOptions(opts)
	if err := check(ledger, job, period, &o); err != nil {
		return Result{}, err
	}
	return peek(ctx, ledger, job, period, &o)
}

func peek(ctx context.Context, ledger Ledger, job string, period Period, o *options) (Result, error) {
	var res Result
	now, err := ledger.Now(ctx)
	if err != nil {
		return res, fmt.Errorf("once: %q: ledger clock: %w", job, err)
	}
	res.Skew = o.clock().Sub(now)
	res.Window = period.Window(now)
	if o.maxSkew > 0 && (res.Skew > o.maxSkew || res.Skew < -o.maxSkew) {
		return res, fmt.Errorf("once: %q: this node's clock is %v off the ledger's (WithMaxSkew %v): %w", job, res.Skew, o.maxSkew, ErrClockSkew)
	}
	r, err := ledger.Get(ctx, job, res.Window.ID)
	switch {
	case errors.Is(err, ErrNoRecord):
		return res, nil
	case err != nil:
		return res, fmt.Errorf("once: %q window %s: ledger: %w", job, res.Window.ID, err)
	}
	res.Record = r
	if r.State == Finished {
		res.Outcome = OutcomeDone
	}
	return res, nil
}

// Begin records the start of an attempt of job's current window (on the
// ledger's clock) under lease, a lease of Key(job) that the caller
// acquired; it is the step of Run between the acquisition and fn, for
// callers that run the work themselves (the CLI's dlock run --once-per).
// It returns OutcomeRan when the attempt is started (run the work under the
// lease, then call End with the result), OutcomeDone when the window has
// finished (do not run it). Errors are Run's, and ErrInvalidArgument for a
// nil lease or a lease of another key.
func Begin(ctx context.Context, ledger Ledger, lease *dlock.Lease, job string, period Period, opts ...Option) (Result, error) {
	o := newOptions(opts)
	if err := check(ledger, job, period, &o); err != nil {
		return Result{}, err
	}
	switch {
	case lease == nil:
		return Result{}, invalid("job %q: nil lease", job)
	case lease.Key() != Key(job):
		return Result{}, invalid("job %q: the lease is on %q, not on the job's key %q", job, lease.Key(), Key(job))
	case lease.Degraded() || lease.Fence() == 0:
		return Result{}, fmt.Errorf("once: %q: the lease on %q has no fence (fail-open, or a store without fences): %w", job, lease.Key(), dlock.ErrUnsupported)
	}
	// Under the lock: the window again (a wait for the lock may have
	// crossed a boundary), and whether it finished while we waited.
	res, err := peek(ctx, ledger, job, period, &o)
	if err != nil || res.Outcome == OutcomeDone {
		return res, err
	}
	rec, err := ledger.Start(ctx, StartRequest{Job: job, Window: res.Window.ID, Fence: lease.Fence(), Owner: lease.Owner(), Node: o.node})
	switch {
	case errors.Is(err, ErrFinished):
		res.Record, res.Outcome = rec, OutcomeDone
		return res, nil
	case errors.Is(err, ErrStaleFence):
		res.Record = rec
		return res, fmt.Errorf("once: %q window %s: ledger refused the start with fence %d: %w", job, res.Window.ID, lease.Fence(), withLease(err, lease))
	case err != nil:
		return res, fmt.Errorf("once: %q window %s: ledger start: %w", job, res.Window.ID, err)
	}
	res.Record, res.Outcome = rec, OutcomeRan
	return res, nil
}

// End records the end of the attempt that Begin started (res is Begin's
// Result, lease the same lease): Finished when runErr is nil, else Failed
// with runErr's text (retried by the next Run in the window). It returns
// the new record in Result.Record. When the ledger refuses (the lease was
// lost and another attempt started since), the error wraps ErrStaleFence,
// and dlock.ErrLeaseLost when the lease was lost; other errors are the
// ledger's, wrapped. Call it before releasing the lease, so that the next
// holder finds the window Finished.
func End(ctx context.Context, ledger Ledger, lease *dlock.Lease, res Result, runErr error) (Result, error) {
	switch {
	case ledger == nil:
		return res, invalid("nil Ledger")
	case lease == nil:
		return res, invalid("nil lease")
	case res.Outcome != OutcomeRan || res.Record.Job == "" || res.Record.Fence != lease.Fence():
		return res, invalid("End of an attempt that Begin did not start with this lease")
	}
	job := res.Record.Job
	msg := ""
	if runErr != nil {
		if msg = runErr.Error(); msg == "" {
			msg = "error"
		}
	}
	rec, err := ledger.Finish(ctx, job, res.Window.ID, lease.Fence(), msg)
	if err != nil {
		if rec.Job != "" {
			res.Record = rec
		}
		if errors.Is(err, ErrStaleFence) {
			return res, fmt.Errorf("once: %q window %s: ledger refused the finish with fence %d (another attempt started after this lease ended): %w", job, res.Window.ID, lease.Fence(), withLease(err, lease))
		}
		return res, fmt.Errorf("once: %q window %s: ledger finish: %w", job, res.Window.ID, err)
	}
	res.Record = rec
	return res, nil
}

// finishTimeout bounds the ledger's finish after fn (retries included),
// which runs even when the caller's ctx has ended.
const finishTimeout = 10 * time.Second

// call runs fn under a context that ends with ctx or with the lease.
func call(ctx context.Context, lease *dlock.Lease, fn func(context.Context, Attempt) error, a Attempt) error {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(lease.Context(), func() { cancel(context.Cause(lease.Context())) })
	defer stop()
	return fn(fctx, a)
}

func newOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		if opt != nil { // a nil Option is skipped, as in the other recipes
			opt(&o)
		}
	}
	return o
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("once: "+format+": %w", append(args, dlock.ErrInvalidArgument)...)
}

func check(ledger Ledger, job string, period Period, o *options) error {
	bad := invalid
	switch {
	case ledger == nil:
		return bad("nil Ledger")
	case job == "":
		return bad("empty job name")
	case len(job) > MaxJobBytes:
		return bad("job name of %d bytes (at most %d)", len(job), MaxJobBytes)
	case !period.Valid():
		return bad("job %q: the zero Period (use Hourly, Daily, Weekly, Monthly or Every)", job)
	case len(o.node) > 256:
		return bad("job %q: node name of %d bytes (at most 256)", job, len(o.node))
	}
	if err := dlock.ValidateKey(Key(job)); err != nil {
		return fmt.Errorf("once: job %q: %w", job, err)
	}
	if o.clock == nil {
		o.clock = time.Now
	}
	if o.node == "" {
		host, _ := os.Hostname()
		o.node = fmt.Sprintf("%s pid %d", host, os.Getpid())
	}
	return nil
}

// withLease adds the lease's loss, if any, to err, on one line.
func withLease(err error, lease *dlock.Lease) error {
	if lerr := lease.Err(); lerr != nil {
		return fmt.Errorf("%w; %w", err, lerr)
	}
	return err
}
