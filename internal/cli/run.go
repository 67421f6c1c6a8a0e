package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock"
)

type runFlags struct {
	ttl         time.Duration
	wait        bool
	waitTimeout time.Duration
	grace       time.Duration
	failOpen    bool
	holder      string
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
passed through, SIGINT and SIGTERM forwarded, and DLOCK_KEY, DLOCK_FENCE and
DLOCK_STORE in its environment (pass DLOCK_FENCE to the resource you write).

Exit status:
  the command's own   the command ran and ended (128+N if killed by signal N)
  75                  KEY is held (without --wait), or --wait-timeout passed; not run
  70                  the lease was lost while the command ran: its process group got
                      SIGTERM at once and SIGKILL after --grace
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
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "after a lost lease, time between SIGTERM and SIGKILL of the command's group")
	fl.BoolVar(&f.failOpen, "fail-open", false, "run the command without a lease when the store cannot be reached (efficiency locks only)")
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
	child := exec.Command(argv[0], argv[1:]...)
	child.Env = env
	child.Stdin, child.Stdout, child.Stderr = g.stdin, g.stdout, g.stderr
	// Own process group (signals reach the whole command); and if dlock
	// itself dies (SIGKILL, OOM kill), the kernel kills the command, which
	// would otherwise run on without a lease. Processes the command put in
	// the background outlive a SIGKILLed dlock: the kernel signals only the
	// direct child.
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	// Forward SIGINT and SIGTERM to the command's group; dlock itself keeps
	// running until the command ends, then releases.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	if err := child.Start(); err != nil {
		releaseLease(lease)
		code := ExitCannotRun
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = ExitNotFound
		}
		return report(code, "not_started", err)
	}
	pgid := child.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	var leaseDone <-chan struct{}
	if lease != nil && !lease.Degraded() {
		leaseDone = lease.Done()
	}
	for {
		select {
		case sig := <-sigs:
			_ = syscall.Kill(-pgid, sig.(syscall.Signal))
		case <-leaseDone:
			lostErr := lease.Err()
			fmt.Fprintf(g.stderr, "dlock: lease on %q lost while the command ran; sending SIGTERM to its process group (SIGKILL after %v)\n", key, f.grace)
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			t := time.NewTimer(f.grace)
			select {
			case <-exited:
				t.Stop()
			case <-t.C:
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				<-exited
			}
			_ = syscall.Kill(-pgid, syscall.SIGKILL) // anything left in the group
			releaseLease(lease)
			return report(ExitLost, "lost", lostErr)
		case werr := <-exited:
			code := exitCode(child.ProcessState, werr)
			_ = syscall.Kill(-pgid, syscall.SIGKILL) // no orphans left in the group
			relErr := releaseLease(lease)
			if errors.Is(relErr, dlock.ErrLeaseLost) {
				fmt.Fprintf(g.stderr, "dlock: lease on %q was lost just as the command ended: %v\n", key, relErr)
				return report(ExitLost, "lost", relErr)
			}
			result := "ran"
			if lease == nil || lease.Degraded() {
				result = "fail_open"
			}
			if code != 0 {
				return report(code, result, nil)
			}
			return report(0, result, nil)
		}
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

func exitCode(ps *os.ProcessState, err error) int {
	if ps == nil {
		return ExitCannotRun
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
