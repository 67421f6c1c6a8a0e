package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/internal/supervise"
	"github.com/dlock-dev/dlock/recipe/election"
)

// This file is dlock elect: run a command while this process leads an
// election (package recipe/election), under the same supervisor, signals
// and exit codes as dlock run.

type electFlags struct {
	ttl         time.Duration
	value       string
	grace       time.Duration
	cgroup      string
	keep        bool
	shell       string
	waitTimeout time.Duration
	retryFor    time.Duration
}

// electResult is dlock elect's JSON report (-o json): one line on stderr
// when dlock elect ends (stdout is the command's).
type electResult struct {
	Name     string   `json:"name"`
	Store    string   `json:"store"`
	Result   string   `json:"result"` // ran, lost, held, unavailable, invalid, interrupted, not_started, permission_denied, unsupported
	Code     string   `json:"code,omitempty"`
	Term     uint64   `json:"term,omitempty"`  // the last term led
	Terms    []uint64 `json:"terms,omitempty"` // every term led, in order (--keep-campaigning)
	ExitCode int      `json:"exit_code"`
	Error    string   `json:"error,omitempty"`
}

func newElectCmd(g *globals) *cobra.Command {
	f := &electFlags{}
	cmd := &cobra.Command{
		Use:   "elect [flags] NAME -- COMMAND [ARGS...]  |  dlock elect [flags] -c 'SHELL COMMAND' NAME",
		Short: "Run a command while this process is the leader of election NAME",
		Long: `Elect campaigns in the leader election NAME (the lock on key NAME: one
leader at a time; package recipe/election) and, once leader, runs COMMAND
for as long as it leads. Campaigning waits, in the store's queue where it has
one, for ever unless --wait-timeout is given.

The command runs under the same supervisor as dlock run's (see dlock run
--help): its own process group (and cgroup), stdin, stdout and stderr
passed through, SIGINT, SIGTERM and SIGHUP forwarded to it, nothing it
starts left running. Its environment has DLOCK_ELECTION and DLOCK_KEY (the
name), DLOCK_TERM and DLOCK_FENCE (the term: the fence of the leader's
lease, strictly greater for every new leader; pass it to the resources the
leader writes), DLOCK_STORE, and DLOCK_VALUE.

--value (default "HOST pid PID") is what observers see as the leader: it is
stored with the grant (dlock status NAME shows it as the holder).

Losing leadership (a renewal refused, the store's push, or the lease's
validity deadline passed with no renewal) terminates the command at once:
SIGTERM, SIGKILL after --grace. Then dlock elect exits 70, or with
--keep-campaigning campaigns again and runs the command anew when it leads
again (a new term). When the command ends by itself, dlock elect resigns
(the next campaigner leads at once) and exits with the command's status.

Store outages while campaigning are retried: for ever, or for --retry-for
when it is given (then exit 69).

Report: with -o json, one JSON line on stderr when dlock elect ends:
{"name", "store", "result", "code", "term", "terms", "exit_code", "error"}.

Exit status (as dlock run's):
  the command's own   the command ran and ended (128+N if killed by signal N)
  75                  not leader within --wait-timeout; not run
  70                  leadership lost while the command ran (without
                      --keep-campaigning): it was terminated
  69                  the store could not be reached (after --retry-for); not run
  64                  bad flags or arguments (name, TTL, value, store URL)
  77                  permission denied by the store
  78                  the store cannot do this
  126, 127            the command could not be started, or was not found
  128+N               campaigning ended by signal N`,
		Example: `  # one scheduler among three hosts; another takes over when it dies
  dlock elect --keep-campaigning --ttl 15s scheduler -- ./scheduler --term-env DLOCK_TERM

  # who leads now
  dlock status scheduler

  # give up after a minute of not leading
  dlock elect --wait-timeout 1m reindex -c './reindex --fence "$DLOCK_TERM"'`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case f.shell != "" && (dash >= 0 && len(args) > dash || len(args) > 1):
				return exit(ExitUsage, "give the command either with -c or after --, not both")
			case f.shell != "" && len(args) != 1:
				return exit(ExitUsage, "usage: dlock elect [flags] -c 'SHELL COMMAND' NAME")
			case f.shell != "":
				return nil
			case dash < 0 && len(args) >= 2:
				return exit(ExitUsage, "missing -- between NAME and the command: dlock elect [flags] %s -- %s", args[0], strings.Join(args[1:], " "))
			case dash < 0 && len(args) == 1:
				return exit(ExitUsage, "no command to run: dlock elect [flags] %s -- COMMAND [ARGS...] (or -c 'SHELL COMMAND')", args[0])
			case dash != 1 || len(args) < 2:
				return exit(ExitUsage, "usage: dlock elect [flags] NAME -- COMMAND [ARGS...]")
			}
			return nil
		},
		ValidArgsFunction: completeKeys(g, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := args[1:]
			if f.shell != "" {
				argv = []string{"/bin/sh", "-c", f.shell}
			}
			retrySet := cmd.Flags().Changed("retry-for")
			return runElect(cmd.Context(), g, f, retrySet, args[0], argv)
		},
	}
	fl := cmd.Flags()
	fl.SetInterspersed(true)
	fl.DurationVar(&f.ttl, "ttl", 30*time.Second, "leader lease TTL: renewed every TTL/3; after a crash the election stays leaderless at most this long")
	fl.DurationVar(&f.waitTimeout, "wait-timeout", 0, "campaign at most this long, then exit 75 (0: for ever)")
	fl.DurationVar(&f.retryFor, "retry-for", 0, "retry a store that cannot be reached this long before exiting 69 (default: for ever while campaigning)")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "when the command is terminated (leadership lost, dlock's death), time between SIGTERM and SIGKILL")
	fl.BoolVar(&f.keep, "keep-campaigning", false, "after losing leadership, campaign again (and run the command again when leading) instead of exiting 70")
	fl.StringVar(&f.cgroup, "cgroup", "auto", `"auto": put the command in a cgroup v2 of its own when the cgroup hierarchy is writable; "off": process group and subreaper only`)
	fl.StringVarP(&f.shell, "shell", "c", "", "run this command string with sh -c instead of the command after --")
	hostname, _ := os.Hostname()
	fl.StringVar(&f.value, "value", fmt.Sprintf("%s pid %d", hostname, os.Getpid()), fmt.Sprintf("the leader's value, shown to observers and stored as the holder description (at most %d bytes, no control characters)", election.MaxValueBytes))
	return cmd
}

func runElect(ctx context.Context, g *globals, f *electFlags, retrySet bool, name string, argv []string) error {
	res := electResult{Name: name, Store: g.redactedStore()}
	report := func(code int, result string, err error) error {
		res.ExitCode, res.Result = code, result
		if code != 0 {
			res.Code = kindOf(code)
		}
		if err != nil {
			res.Error = strings.TrimPrefix(err.Error(), "dlock: ")
			if !g.json() {
				printErr(g.stderr, err)
			}
		}
		if g.json() {
			b, _ := json.Marshal(res)
			_, _ = g.stderr.Write(append(b, '\n'))
		}
		if code == 0 {
			return nil
		}
		return &exitError{code: code} // reported above
	}
	invalid := func(err error) error {
		var ee *exitError
		if errors.As(err, &ee) && ee.err != nil {
			err = ee.err
		}
		return report(ExitUsage, "invalid", err)
	}
	if err := dlock.ValidateKey(name); err != nil {
		return invalid(fmt.Errorf("election name: %w", err))
	}
	if err := dlock.ValidateTTL(f.ttl); err != nil {
		return invalid(fmt.Errorf("--ttl: %w", err))
	}
	if err := dlock.ValidateHolder(f.value); err != nil {
		return invalid(fmt.Errorf("--value: %w", err))
	}
	switch {
	case f.grace < 0 || f.waitTimeout < 0 || f.retryFor < 0:
		return invalid(errors.New("--grace, --wait-timeout and --retry-for must not be negative"))
	case f.cgroup != "auto" && f.cgroup != "off":
		return invalid(fmt.Errorf("--cgroup must be auto or off, not %q", f.cgroup))
	}
	if err := g.checkStore(); err != nil {
		return invalid(err)
	}

	var sayOnce atomic.Bool
	sayRetrying := func(cause error) {
		if sayOnce.Swap(true) {
			return
		}
		budget := "until it answers"
		if retrySet {
			budget = fmt.Sprintf("for up to %v (--retry-for)", f.retryFor)
		}
		fmt.Fprintf(g.stderr, "dlock: elect %q: cannot reach the store at %s (%s); retrying %s\n", name, g.storeAddr(), plainCause(cause), budget)
	}
	renewed := &renewObserver{retry: func(e dlock.RetryEvent) { sayRetrying(e.Err) }}
	debugf := func(string, ...any) {}
	if g.debug {
		debugf = func(format string, args ...any) { fmt.Fprintf(g.stderr, "dlock: debug: "+format+"\n", args...) }
		renewed.debugf = debugf
	}
	opts := []dlock.Option{dlock.WithTTL(f.ttl), dlock.WithKeyClass("cli"), dlock.WithObserver(renewed)}
	retried := time.Duration(-1)
	if retrySet {
		opts = append(opts, dlock.WithRetryFor(f.retryFor))
		retried = f.retryFor
	}

	// SIGINT, SIGTERM and SIGHUP never kill dlock: while campaigning they
	// end the campaign (exit 128+N); while the command runs they are
	// forwarded to it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	// interruptible runs fn under a context that the first signal cancels,
	// and returns the signal, if any.
	interruptible := func(fn func(ctx context.Context)) *interrupted {
		ictx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			select {
			case s := <-sigs:
				cancel(interrupted{s.(syscall.Signal)})
			case <-stop:
			}
		}()
		fn(ictx)
		close(stop)
		<-done
		var intr interrupted
		if errors.As(context.Cause(ictx), &intr) {
			return &intr
		}
		return nil
	}

	var locker *dlock.Locker
	var err error
	if intr := interruptible(func(ctx context.Context) { locker, err = g.openRetrying(ctx, retried, sayRetrying) }); intr != nil {
		if locker != nil {
			_ = locker.Close()
		}
		return report(128+int(intr.sig), "interrupted", intr)
	}
	var ee *exitError
	switch {
	case err != nil && errors.As(err, &ee) && ee.code == ExitUsage:
		return invalid(ee.err)
	case err != nil && errors.As(err, &ee) && ee.code == ExitUnavailable && ee.detail != nil:
		return report(ExitUnavailable, "unavailable", g.unavailable("elect", name, ee.detail, retried))
	case err != nil:
		return report(ExitUnavailable, "unavailable", err)
	}
	defer locker.Close()

	for {
		var lead *election.Leadership
		debugf("campaigning in %q as %q", name, f.value)
		intr := interruptible(func(ctx context.Context) {
			if f.waitTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, f.waitTimeout)
				defer cancel()
			}
			lead, err = election.Campaign(ctx, locker, name, f.value, opts...)
		})
		if intr != nil {
			if lead != nil {
				_ = resign(lead)
			}
			return report(128+int(intr.sig), "interrupted", fmt.Errorf("%w: not leader of %q; not run", *intr, name))
		}
		switch {
		case err == nil:
		case errors.Is(err, dlock.ErrPermissionDenied): // before ErrInvalidArgument, which it matches
			var ee *exitError
			errors.As(g.noPerm(err), &ee)
			return report(ExitNoPerm, "permission_denied", ee.err)
		case errors.Is(err, dlock.ErrInvalidArgument):
			return invalid(err)
		case errors.Is(err, dlock.ErrUnsupported):
			return report(ExitUnsupported, "unsupported", err)
		case errors.Is(err, dlock.ErrUnavailable):
			return report(ExitUnavailable, "unavailable", g.unavailable("elect", name, err, retried))
		case errors.Is(err, context.DeadlineExceeded):
			return report(ExitHeld, "held", fmt.Errorf("elect %q: not leader after --wait-timeout %v%s; not run", name, f.waitTimeout, leaderNow(ctx, locker, name)))
		default:
			return report(ExitUnavailable, "unavailable", fmt.Errorf("elect %q: %w", name, err))
		}
		res.Term = lead.Term()
		res.Terms = append(res.Terms, lead.Term())
		debugf("leader of %q, term %d", name, lead.Term())

		code, result, runErr, again := superviseLeader(g, f, lead, renewed, sigs, argv)
		if again && f.keep {
			fmt.Fprintf(g.stderr, "dlock: leadership of %q lost (term %d): %v; campaigning again (--keep-campaigning)\n", name, lead.Term(), plainCause(runErr))
			continue
		}
		return report(code, result, runErr)
	}
}

// superviseLeader runs argv while lead lasts, as dlock run runs a command
// under a lease. It returns the exit code, result and error to report, and
// whether leadership was lost under the command (again: the caller may
// campaign again).
func superviseLeader(g *globals, f *electFlags, lead *election.Leadership, renewed *renewObserver, sigs <-chan os.Signal, argv []string) (code int, result string, err error, again bool) {
	term := strconv.FormatUint(lead.Term(), 10)
	env := append(childEnviron(os.Environ()),
		"DLOCK_ELECTION="+lead.Name(), "DLOCK_KEY="+lead.Name(), "DLOCK_TERM="+term, "DLOCK_FENCE="+term,
		"DLOCK_STORE="+g.store, "DLOCK_VALUE="+lead.Value())
	cfg := supervise.Config{
		Argv: argv, Env: env, Stdin: g.stdin, Stdout: g.stdout, Stderr: g.stderr,
		Grace: f.grace, Cgroup: f.cgroup == "auto", NoCgroupReason: "--cgroup off",
		Deadline: lead.Lease().Deadline(),
		Warnf: func(format string, args ...any) {
			fmt.Fprintf(g.stderr, "dlock: "+format+"\n", args...)
		},
	}
	if g.debug {
		cfg.Debugf = func(format string, args ...any) { fmt.Fprintf(g.stderr, "dlock: debug: "+format+"\n", args...) }
	}
	job, serr := supervise.Start(cfg)
	if serr != nil {
		_ = resign(lead)
		code := ExitCannotRun
		var se *supervise.StartError
		if errors.As(serr, &se) {
			code = se.Code
		}
		return code, "not_started", startError(code, argv, serr), false
	}
	onRenew := func() { job.SetDeadline(lead.Lease().Deadline()) }
	renewed.on.Store(&onRenew)
	defer renewed.on.Store(nil)
	job.SetDeadline(lead.Lease().Deadline()) // a renewal may have come before

	for {
		select {
		case sig := <-sigs:
			job.Signal(sig.(syscall.Signal))
		case <-lead.Done():
			lostErr := lead.Err()
			fmt.Fprintf(g.stderr, "dlock: leadership of %q (term %d) lost while the command ran; sending SIGTERM to everything it started (SIGKILL after %v)\n", lead.Name(), lead.Term(), f.grace)
			job.Terminate()
			<-job.Done()
			return ExitLost, "lost", lostErr, true
		case <-job.Done():
			r := job.Result()
			relErr := resign(lead)
			if r.Reason == supervise.ReasonDeadline {
				err := fmt.Errorf("leadership of %q (term %d) passed its validity deadline with no renewal (dlock was stopped or starved); the command was terminated", lead.Name(), lead.Term())
				return ExitLost, "lost", err, true
			}
			if errors.Is(relErr, dlock.ErrLeaseLost) {
				fmt.Fprintf(g.stderr, "dlock: leadership of %q was lost just as the command ended: %v\n", lead.Name(), relErr)
				return ExitLost, "lost", relErr, false
			}
			if relErr != nil {
				fmt.Fprintf(g.stderr, "dlock: warning: could not resign %q (term %d): %s; the next leader waits until the store expires it (TTL %v)\n",
					lead.Name(), lead.Term(), plainCause(relErr), f.ttl)
			}
			return r.Code, "ran", nil, false
		}
	}
}

// resign gives up lead within 10 s.
func resign(lead *election.Leadership) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return lead.Resign(ctx)
}

// leaderNow describes the current leader of name for a message, or "".
func leaderNow(ctx context.Context, l *dlock.Locker, name string) string {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	cur, err := election.Leader(ictx, l, name)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" (leader: %s, term %d)", quoteIfControl(cur.Value), cur.Term)
}
