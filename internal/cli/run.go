package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/internal/supervise"
)

type runFlags struct {
	ttl         time.Duration
	wait        bool
	waitTimeout time.Duration
	grace       time.Duration
	failOpen    bool
	holder      string
	cgroup      string
	debug       bool
}

// runResult is what --output json prints to stderr when the command ends
// (stdout belongs to the command).
type runResult struct {
	Key      string `json:"key"`
	Store    string `json:"store"`
	Result   string `json:"result"` // ran, held, unavailable, lost, fail_open
	Fence    uint64 `json:"fence,omitempty"`
	ExitCode int    `json:"exit_code"`
	Error    string `json:"error,omitempty"`
}

func newRunCmd(g *globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run [flags] KEY -- COMMAND [ARGS...]",
		Short: "Run a command under a lease on KEY",
		Long: `Run acquires a lease on KEY, runs COMMAND while renewing the lease, and
releases it when COMMAND ends.

The command runs in its own process group with stdin, stdout and stderr
passed through, SIGINT, SIGTERM and SIGHUP forwarded to that group, and
DLOCK_KEY, DLOCK_FENCE and DLOCK_STORE in its environment (pass DLOCK_FENCE
to the resource you write).

Nothing the command starts outlives the lease. dlock runs it under a
supervisor (dlock's own binary, re-executed) that owns the command's process
group, is a child subreaper (daemons the command double-forks stay below it)
and, where cgroup v2 is writable, puts the command in a cgroup of its own.
It kills all of that, background and daemonized processes included:
  - when the command ends: whatever it left running gets SIGKILL;
  - when the lease is lost, or its validity deadline passes with no renewal
    from dlock (dlock stopped or starved): SIGTERM, SIGKILL after --grace;
  - when dlock itself dies (SIGKILL, OOM kill): SIGTERM, then SIGKILL after
    --grace or at the lease's validity deadline, whichever comes first, so
    none of it runs once another holder can get KEY.
dlock exits, and releases KEY, only when all of it is gone (a process stuck
in the kernel is given up on after 10s of SIGKILL, with a warning). Not
covered: work handed to another service (systemd-run, at, a container
runtime, ssh or any remote call), which leaves both the process tree and the
cgroup; and, without a cgroup, daemons re-parented elsewhere if the
supervisor itself is SIGKILLed. --debug says which mode ran; --cgroup off
skips the cgroup.

Exit status:
  the command's own   the command ran and ended (128+N if killed by signal N)
  75                  KEY is held (without --wait), or --wait-timeout passed; not run
  70                  the lease was lost (or its validity passed unrenewed) while the
                      command ran: everything it started got SIGTERM at once and
                      SIGKILL after --grace
  69                  the store could not be reached; not run (unless --fail-open)
  64                  bad flags or arguments
  126, 127            the command could not be started, or was not found`,
		Example: `  # a cron job on six machines that must run once
  dlock run payout:2026-09 -- ./payout --month 2026-09

  # wait up to five minutes for the previous run to finish
  dlock run --wait --wait-timeout 5m --ttl 1m nightly-report -- ./report.sh

  # an efficiency lock: run even when the store is down
  dlock run --fail-open cache-warmup -- ./warm.sh`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if dash != 1 || len(args) < 2 {
				return exit(ExitUsage, "usage: dlock run [flags] KEY -- COMMAND [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runUnderLease(cmd.Context(), g, f, args[0], args[1:])
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.ttl, "ttl", 30*time.Second, "lease TTL; renewed every TTL/3 while the command runs")
	fl.BoolVar(&f.wait, "wait", false, "wait for KEY instead of exiting 75 when it is held")
	fl.DurationVar(&f.waitTimeout, "wait-timeout", 0, "with --wait, give up after this long and exit 75 (0: wait forever)")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "when the command is terminated (lost lease, dlock's death), time between SIGTERM and SIGKILL")
	fl.BoolVar(&f.failOpen, "fail-open", false, "run the command without a lease when the store cannot be reached (efficiency locks only)")
	fl.StringVar(&f.cgroup, "cgroup", "auto", `"auto": put the command in a cgroup v2 of its own when the cgroup hierarchy is writable; "off": process group and subreaper only`)
	fl.BoolVar(&f.debug, "debug", false, "print how the command is supervised (cgroup or not) and what the supervisor does, to stderr")
	hostname, _ := os.Hostname()
	fl.StringVar(&f.holder, "holder", fmt.Sprintf("%s pid %d", hostname, os.Getpid()), "holder description stored with the grant")
	return cmd
}

func runUnderLease(ctx context.Context, g *globals, f *runFlags, key string, argv []string) error {
	res := runResult{Key: key, Store: g.store}
	report := func(code int, result string, err error) error {
		res.ExitCode, res.Result = code, result
		if err != nil {
			res.Error = err.Error()
		}
		if g.json() {
			_ = jsonTo(g.stderr).Encode(res)
			err = nil // the JSON says it
		}
		if code == 0 {
			return nil
		}
		return &exitError{code: code, err: err}
	}
	if err := dlock.ValidateKey(key); err != nil {
		return report(ExitUsage, "invalid", err)
	}
	if err := dlock.ValidateTTL(f.ttl); err != nil {
		return report(ExitUsage, "invalid", err)
	}

	opts := []dlock.Option{dlock.WithTTL(f.ttl), dlock.WithHolder(f.holder), dlock.WithKeyClass("cli")}
	if f.failOpen {
		opts = append(opts, dlock.WithFailOpen())
	}
	if f.grace < 0 || f.waitTimeout < 0 {
		return report(ExitUsage, "invalid", fmt.Errorf("--grace and --wait-timeout must not be negative"))
	}
	if f.cgroup != "auto" && f.cgroup != "off" {
		return report(ExitUsage, "invalid", fmt.Errorf("--cgroup must be auto or off, not %q", f.cgroup))
	}
	// The supervisor learns of every renewal at once: it terminates the
	// command when the validity deadline passes unrenewed.
	renewed := &renewObserver{}
	opts = append(opts, dlock.WithObserver(renewed))
	locker, err := g.open(ctx)
	var lease *dlock.Lease
	var ee *exitError
	switch {
	case err != nil && f.failOpen && errors.As(err, &ee) && ee.code == ExitUnavailable:
		fmt.Fprintf(g.stderr, "dlock: store unreachable, running %q WITHOUT a lock (--fail-open): %v\n", key, err)
	case err != nil && errors.As(err, &ee) && ee.code == ExitUsage:
		return report(ExitUsage, "invalid", ee.err)
	case err != nil:
		return report(ExitUnavailable, "unavailable", err)
	default:
		defer locker.Close()
		lease, err = acquire(ctx, locker, f, key, opts)
		switch {
		case err == nil && lease.Degraded():
			fmt.Fprintf(g.stderr, "dlock: store unavailable, running %q WITHOUT a lock (--fail-open)\n", key)
		case err == nil:
		case errors.As(err, new(interrupted)):
			var intr interrupted
			errors.As(err, &intr)
			return report(128+int(intr.sig), "interrupted", err)
		case errors.Is(err, dlock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%s still held after --wait-timeout %v: %w", key, f.waitTimeout, err)
			}
			return report(ExitHeld, "held", err)
		case errors.Is(err, dlock.ErrUnavailable):
			return report(ExitUnavailable, "unavailable", err)
		case errors.Is(err, dlock.ErrInvalidKey), errors.Is(err, dlock.ErrInvalidTTL):
			return report(ExitUsage, "invalid", err)
		default:
			return report(ExitHeld, "held", err) // interrupted while waiting
		}
	}

	env := append(os.Environ(), "DLOCK_KEY="+key, "DLOCK_STORE="+g.store)
	if lease != nil {
		res.Fence = lease.Fence()
		env = append(env, "DLOCK_FENCE="+strconv.FormatUint(lease.Fence(), 10))
	}
	// Forward SIGINT, SIGTERM and SIGHUP to the command's group; dlock
	// itself keeps running until the command ends, then releases.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	cfg := supervise.Config{
		Argv: argv, Env: env, Stdin: g.stdin, Stdout: g.stdout, Stderr: g.stderr,
		Grace: f.grace, Cgroup: f.cgroup == "auto", NoCgroupReason: "--cgroup off",
		Warnf: func(format string, args ...any) { fmt.Fprintf(g.stderr, "dlock: "+format+"\n", args...) },
	}
	if f.debug {
		cfg.Debugf = func(format string, args ...any) { fmt.Fprintf(g.stderr, "dlock: debug: "+format+"\n", args...) }
	}
	var leaseDone <-chan struct{}
	if lease != nil && !lease.Degraded() {
		leaseDone = lease.Done()
		cfg.Deadline = lease.Deadline()
	}
	job, err := supervise.Start(cfg)
	if err != nil {
		releaseLease(lease)
		code := ExitCannotRun
		var se *supervise.StartError
		if errors.As(err, &se) {
			code = se.Code
		}
		return report(code, "not_started", err)
	}
	if leaseDone != nil {
		onRenew := func() { job.SetDeadline(lease.Deadline()) }
		renewed.on.Store(&onRenew)
		job.SetDeadline(lease.Deadline()) // a renewal may have come before
	}

	for {
		select {
		case sig := <-sigs:
			job.Signal(sig.(syscall.Signal))
		case <-leaseDone:
			lostErr := lease.Err()
			fmt.Fprintf(g.stderr, "dlock: lease on %q lost while the command ran; sending SIGTERM to everything it started (SIGKILL after %v)\n", key, f.grace)
			job.Terminate()
			<-job.Done()
			releaseLease(lease)
			return report(ExitLost, "lost", lostErr)
		case <-job.Done():
			r := job.Result()
			relErr := releaseLease(lease)
			if r.Reason == supervise.ReasonDeadline {
				err := fmt.Errorf("dlock: lease on %q passed its validity deadline with no renewal (dlock was stopped or starved); the command was terminated", key)
				if errors.Is(relErr, dlock.ErrLeaseLost) {
					err = fmt.Errorf("%w: %w", err, relErr)
				}
				return report(ExitLost, "lost", err)
			}
			if errors.Is(relErr, dlock.ErrLeaseLost) {
				fmt.Fprintf(g.stderr, "dlock: lease on %q was lost just as the command ended: %v\n", key, relErr)
				return report(ExitLost, "lost", relErr)
			}
			result := "ran"
			if lease == nil || lease.Degraded() {
				result = "fail_open"
			}
			if r.Code != 0 {
				return report(r.Code, result, nil)
			}
			return report(0, result, nil)
		}
	}
}

// renewObserver calls on after each confirmed renewal; dlock run uses it to
// pass the lease's new validity deadline to the supervisor at once.
type renewObserver struct{ on atomic.Pointer[func()] }

func (o *renewObserver) AcquireDone(dlock.AcquireEvent) {}
func (o *renewObserver) LeaseEnded(dlock.EndEvent)      {}
func (o *renewObserver) Renewed(e dlock.RenewEvent) {
	if f := o.on.Load(); f != nil && e.Err == nil {
		(*f)()
	}
}

func acquire(ctx context.Context, l *dlock.Locker, f *runFlags, key string, opts []dlock.Option) (*dlock.Lease, error) {
	if !f.wait {
		return l.TryAcquire(ctx, key, opts...)
	}
	if f.waitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.waitTimeout)
		defer cancel()
	}
	// While waiting, SIGINT or SIGTERM ends the wait; dlock then exits
	// 128+N, as the shell reports a command killed by signal N.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case s := <-sigs:
			cancel(interrupted{s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()
	lease, err := l.Acquire(ctx, key, opts...)
	var intr interrupted
	if err != nil && errors.As(context.Cause(ctx), &intr) {
		return nil, fmt.Errorf("%w: %w", intr, err)
	}
	return lease, err
}

// interrupted is the cause of a wait ended by a signal.
type interrupted struct{ sig syscall.Signal }

func (i interrupted) Error() string { return "wait interrupted by " + i.sig.String() }

func releaseLease(lease *dlock.Lease) error {
	if lease == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return lease.Release(ctx)
}
