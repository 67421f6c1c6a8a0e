package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/internal/supervise"
)

// Bounds of run's numeric flags.
const (
	// MaxPermits bounds --permits: each attempt may try every slot.
	MaxPermits = 1024
	// DefaultRetryFor is --retry-for's default: how long an acquisition
	// without --wait retries a store that cannot be reached.
	DefaultRetryFor = 5 * time.Second
)

type runFlags struct {
	ttl          time.Duration
	wait         bool
	waitTimeout  time.Duration
	retryFor     time.Duration
	grace        time.Duration
	failOpen     bool
	holder       string
	cgroup       string
	permits      int
	conflictCode int
	shell        string
	report       string
	once         onceFlags   // --once-per, --ledger (once.go)
	resume       resumeFlags // --resume-file, --max-hold (resume.go)
}

// runResult is dlock run's JSON report (-o json or --report): one line,
// written when dlock run ends, to --report or else to stderr (stdout
// belongs to the command).
type runResult struct {
	Key      string `json:"key"`
	Store    string `json:"store"`
	Result   string `json:"result"` // ran, held, unavailable, invalid, lost, fail_open, interrupted, not_started
	Code     string `json:"code,omitempty"`
	Fence    uint64 `json:"fence,omitempty"`
	Permit   *int   `json:"permit,omitempty"`
	SlotKey  string `json:"permit_key,omitempty"`
	Window   string `json:"window,omitempty"`  // --once-per: the period's window (once.go)
	Resumed  bool   `json:"resumed,omitempty"` // --resume-file: the saved lease was resumed (resume.go)
	ExitCode int    `json:"exit_code"`
	Error    string `json:"error,omitempty"`
	// ReleaseError is set when the final release failed: the cause in one
	// plain line (ReleaseDetail: the store's raw error). KeyHeldUpTo is
	// then the longest the key may stay held by nobody's job, in seconds,
	// until the store expires it: when the store could not be reached
	// (KeyHeldFrom "store_reachable_again"), its TTL counted from when the
	// store is reachable again (a restarted dlockd restarts every
	// countdown); otherwise (KeyHeldFrom "now") counted from the report.
	ReleaseError  string  `json:"release_error,omitempty"`
	ReleaseDetail string  `json:"release_detail,omitempty"`
	KeyHeldUpTo   float64 `json:"key_held_up_to_seconds,omitempty"`
	KeyHeldFrom   string  `json:"key_held_from,omitempty"`
}

// PermitKey returns the key of slot i of the semaphore KEY that --permits
// uses: "KEY/permit-I", I from 0 to N-1.
func PermitKey(key string, i int) string { return key + "/permit-" + strconv.Itoa(i) }

func newRunCmd(g *globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run [flags] KEY -- COMMAND [ARGS...]  |  dlock run [flags] -c 'SHELL COMMAND' KEY",
		Short: "Run a command under a lease on KEY",
		Long: `Run acquires a lease on KEY, runs COMMAND while renewing the lease, and
releases it when COMMAND ends. The command follows --; with -c (--shell) it
is one string run by sh -c instead.

The command runs in its own process group with stdin, stdout and stderr
passed through, SIGINT, SIGTERM and SIGHUP forwarded to that group, and
DLOCK_KEY, DLOCK_FENCE and DLOCK_STORE in its environment (pass DLOCK_FENCE
to the resource you write). DLOCK_TOKEN is taken out of it: the token is
dlock's credential, not the command's (give it one of its own if it must
call dlockd). When stdin is the terminal dlock runs in the
foreground of, the command's group gets the terminal: it can read it,
Ctrl-C reaches it directly, Ctrl-Z stops dlock's job (fg resumes it), and
the terminal comes back to dlock when it ends.

Waiting: without --wait, a held KEY exits 75 (--conflict-exit-code) at
once, naming its holder where the store can tell. --wait waits for it;
--wait-timeout D waits at most D (and implies --wait, as flock -w does;
--wait-timeout 0 makes one attempt, as flock -w 0, unless --wait is given).
A store that cannot be reached, or is restarting or electing a leader, is
retried: without --wait for --retry-for (default 5s), with --wait until
--wait-timeout (for ever without one, unless --retry-for is given); only
then does run exit 69.

Semaphore: --permits N lets up to N holders run at once (package
recipe/semaphore). On a store with native semaphores (dlockd, mem) each
holder holds one of N counted grants of the key KEY/permit-shared and
--wait waits in the store's FIFO queue; DLOCK_FENCE is the permit's own
fence and DLOCK_PERMIT_KEY that key (DLOCK_PERMIT is not set: a native
permit has no index). Elsewhere KEY names N slots, the keys KEY/permit-0
... KEY/permit-(N-1); run tries them in random order and takes a free one
(with --wait it retries with jittered backoff, woken early by release
hints); DLOCK_FENCE is that slot's fence, DLOCK_PERMIT its index and
DLOCK_PERMIT_KEY its key. Every user of KEY must give the same N.

Once per period: --once-per day|hour|week|month|DURATION --ledger DSN runs
the command at most once per period across all nodes (package
recipe/once): KEY names the job and the lock is once/KEY. The ledger (a
table in postgres://… or in a SQLite file, sqlite:PATH; or redis://… with
persistence) records each window's start and finish with the lease's
fence, and its clock, not this machine's, decides the window. A window
that finished is not run again: exit 0 with a message, result "done". A
command that exits non-zero, or whose node crashed, is retried by the next
run in the same window (a crashed one once its lease expired).
DLOCK_WINDOW and DLOCK_ATTEMPT name the window and the attempt. A finish
the ledger refuses (this lease ended and another node started the window)
exits 70.

Resuming: --resume-file F keeps a re-executed job's lease (a job killed and
restarted by its scheduler). Once granted, the lease's token (key, owner
token, fence, TTL) is written to F, mode 0600; on the next start with the
same F and KEY, run resumes that lease if the store still holds it, after
the store confirms owner and fence, so DLOCK_FENCE is unchanged (report:
"resumed": true). A file whose lease is gone (expired, released, taken
over), malformed, for another KEY, or readable or writable by others, is
never trusted: run says so on stderr and acquires afresh, replacing it. F
is removed when run ends. While a run uses F it holds a lock on F.lock, so
a second run started meanwhile with the same F (a job overlapping itself)
does not resume the first one's lease: it acquires afresh, and finds KEY
held. Stores whose grants end with their process
(ZooKeeper, pgadvisory) cannot resume: run says so and acquires afresh.
--max-hold D stops renewing D after the grant (counted from the first grant
across resumptions): the command is then terminated as on a lost lease
(exit 70), and the key is free once its TTL runs out.

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

A release that fails when the command ends (the store is down) is not an
error of the command: dlock run prints a warning with the key, the fence
and how long the key stays held until the store expires it: when the store
could not be reached, at most its TTL after the store is reachable again (a
restarted dlockd restarts every countdown at full TTL); otherwise what was
left of the lease. It exits with the command's own status. A lease lost
while the command ran is different: exit 70.

--fail-open runs the command without a lock whenever the outcome would be
exit 69 (the store could not be reached), whatever --wait, --wait-timeout
and --retry-for say; never for 64 (invalid input) or 75 (held).
--wait-timeout always makes one attempt first, however short it is.
--conflict-exit-code 0 makes a conflict quiet: nothing on stderr (unless
--debug).

Report: with -o json, or --report, dlock run writes exactly one JSON line
on every exit, usage errors included: {"key", "store", "result", "code",
"fence", "permit", "permit_key", "exit_code", "error"}, and after a failed
final release "release_error" (the cause, one line), "release_detail" (the
store's raw error), "key_held_up_to_seconds" (the longest the key may stay
held with no job behind it until the store expires it; not how long the job
held it) and "key_held_from" ("store_reachable_again": counted from when
the store is back; "now": from the report). result is one of ran, held,
unavailable, invalid, lost, fail_open, interrupted, not_started. It goes to
--report (a file path, or fd:N for an open descriptor), else as the last
line of stderr, after everything the command wrote; stdout is the
command's alone.

Exit status:
  the command's own   the command ran and ended (128+N if killed by signal N),
                      also when the final release failed (with a warning)
  75                  KEY is held (without --wait), or --wait-timeout passed; not run
                      (--conflict-exit-code N changes it)
  70                  the lease was lost (or its validity passed unrenewed) while the
                      command ran: everything it started got SIGTERM at once and
                      SIGKILL after --grace; also when a renewal was refused for
                      the token (revoked by a reload of dlockd's auth file): the
                      lease ends at the first refusal, result "lost"
  69                  the store could not be reached (after --retry-for); not run
                      (unless --fail-open)
  64                  bad flags or arguments, or input the store refused (key,
                      TTL, holder, store URL); never run, even with --fail-open
  77                  permission denied: the store refused the token or client
                      certificate, or it lacks lock on KEY; never run, even with
                      --fail-open
  126, 127            the command could not be started, or was not found
  128+N               a wait ended by signal N`,
		Example: `  # a cron job on six machines that must run once
  dlock run payout:2026-09 -- ./payout --month 2026-09

  # wait up to five minutes for the previous run to finish
  dlock run --wait-timeout 5m --ttl 1m nightly-report -- ./report.sh

  # at most 3 concurrent backups; exit 0 quietly when all 3 run (flock -E 0)
  dlock run --permits 3 --conflict-exit-code 0 backups -c 'pg_dump db > /backup/db.sql'

  # a JSON report for the scheduler, away from the job's output
  dlock run -o json --report /var/log/job.json job -- ./job.sh

  # a daily job on every node of a fleet, run by one of them once per day
  dlock run --once-per day --ledger postgres://app@db/app nightly-report -- ./report.sh

  # an efficiency lock: run even when the store is down
  dlock run --fail-open cache-warmup -- ./warm.sh`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				g.runKey = args[0]
			}
			dash := cmd.ArgsLenAtDash()
			switch {
			case f.shell != "" && (dash >= 0 && len(args) > dash || len(args) > 1):
				return exit(ExitUsage, "give the command either with -c or after --, not both")
			case f.shell != "" && len(args) != 1:
				return exit(ExitUsage, "usage: dlock run [flags] -c 'SHELL COMMAND' KEY")
			case f.shell != "":
				return nil
			case dash < 0 && len(args) >= 2:
				return exit(ExitUsage, "missing -- between KEY and the command: dlock run [flags] %s -- %s", args[0], strings.Join(args[1:], " "))
			case dash < 0 && len(args) == 1:
				return exit(ExitUsage, "no command to run: dlock run [flags] %s -- COMMAND [ARGS...] (or -c 'SHELL COMMAND')", args[0])
			case dash != 1 || len(args) < 2:
				return exit(ExitUsage, "usage: dlock run [flags] KEY -- COMMAND [ARGS...]")
			}
			return nil
		},
		ValidArgsFunction: completeKeys(g, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("wait-timeout") && f.waitTimeout > 0 {
				// --wait-timeout implies --wait, as flock -w; and as
				// flock -w 0, --wait-timeout 0 makes one attempt
				// (unless --wait is given too: then it waits for ever).
				f.wait = true
			}
			argv := args[1:]
			if f.shell != "" {
				argv = []string{"/bin/sh", "-c", f.shell}
			}
			retrySet := cmd.Flags().Changed("retry-for") || g.fromEnvOrFile["retry-for"]
			return runUnderLease(cmd.Context(), g, f, retrySet, args[0], argv)
		},
	}
	g.runReport = &f.report
	fl := cmd.Flags()
	fl.SetInterspersed(true)
	fl.DurationVar(&f.ttl, "ttl", 30*time.Second, "lease TTL; renewed every TTL/3 while the command runs (env DLOCK_TTL, file: ttl)")
	fl.BoolVar(&f.wait, "wait", false, "wait for KEY instead of exiting 75 when it is held")
	fl.DurationVar(&f.waitTimeout, "wait-timeout", 0, "wait at most this long, then exit 75; implies --wait (0: one attempt, as flock -w 0; with --wait, wait for ever)")
	fl.DurationVar(&f.retryFor, "retry-for", DefaultRetryFor, "retry a store that cannot be reached (down, restarting, electing a leader) this long before exiting 69 (env DLOCK_RETRY_FOR, file: retry_for); with --wait the default is the whole wait")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "when the command is terminated (lost lease, dlock's death), time between SIGTERM and SIGKILL")
	fl.BoolVar(&f.failOpen, "fail-open", false, "run the command without a lease when the store cannot be reached (efficiency locks only; never for invalid input)")
	fl.StringVar(&f.cgroup, "cgroup", "auto", `"auto": put the command in a cgroup v2 of its own when the cgroup hierarchy is writable; "off": process group and subreaper only`)
	fl.IntVar(&f.permits, "permits", 0, fmt.Sprintf("semaphore: let up to N holders of KEY run at once: N permits of the key KEY/permit-shared where the store has native semaphores (dlockd), else the slot keys KEY/permit-0..N-1 (1-%d; 0: a plain lock)", MaxPermits))
	f.once.addFlags(fl)
	f.resume.addFlags(fl)
	fl.IntVar(&f.conflictCode, "conflict-exit-code", ExitHeld, "exit status when KEY is held or --wait-timeout passed (0-255; flock -E)")
	fl.StringVarP(&f.shell, "shell", "c", "", "run this command string with sh -c instead of the command after --")
	fl.StringVar(&f.report, "report", "", `write the JSON report here: a file path, or "fd:N" for an open file descriptor (implies the report; default with -o json: stderr)`)
	hostname, _ := os.Hostname()
	fl.StringVar(&f.holder, "holder", fmt.Sprintf("%s pid %d", hostname, os.Getpid()), fmt.Sprintf("holder description stored with the grant, at most %d bytes, no control characters (env DLOCK_HOLDER, file: holder)", dlock.MaxHolderBytes))
	return cmd
}

// openReport opens --report: a path (created or truncated) or fd:N.
func openReport(spec string) (io.WriteCloser, error) {
	if v, ok := strings.CutPrefix(spec, "fd:"); ok {
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 0 {
			return nil, fmt.Errorf("--report %q: want fd:N with N a file descriptor number", spec)
		}
		if err := syscall.Fstat(fd, new(syscall.Stat_t)); err != nil { // not open
			return nil, fmt.Errorf("--report %q: file descriptor %d is not open", spec, fd)
		}
		return os.NewFile(uintptr(fd), "fd:"+v), nil
	}
	w, err := os.OpenFile(spec, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--report: %w", err)
	}
	return w, nil
}

func runUnderLease(ctx context.Context, g *globals, f *runFlags, retrySet bool, key string, argv []string) error {
	res := runResult{Key: key, Store: g.redactedStore()}
	key = f.once.lockKey(key) // --once-per: the lock is once/KEY (once.go)
	var reportTo io.Writer
	if g.json() {
		reportTo = g.stderr
	}
	if f.report != "" {
		w, err := openReport(f.report)
		if err != nil {
			return &exitError{code: ExitUsage, err: err}
		}
		defer w.Close()
		reportTo = w
	}
	heldCode := f.conflictCode
	report := func(code int, result string, err error) error {
		res.ExitCode, res.Result = code, result
		if code != 0 || err != nil {
			res.Code = kindOf(code)
			if code == heldCode && result == "held" {
				res.Code = codeHeld
			}
		}
		if err != nil {
			res.Error = strings.TrimPrefix(err.Error(), "dlock: ")
		}
		// --conflict-exit-code 0: a conflict is quiet (flock -E 0), unless --debug.
		quiet := result == "held" && code == 0 && !g.debug
		if err != nil && reportTo != g.stderr && !quiet { // on stderr, the report says it
			printErr(g.stderr, err)
			var ee *exitError
			if g.debug && errors.As(err, &ee) && ee.detail != nil {
				fmt.Fprintf(g.stderr, "dlock: debug: %v\n", ee.detail)
			}
		}
		if reportTo != nil {
			b, _ := json.Marshal(res)
			_, _ = reportTo.Write(append(b, '\n'))
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
	// Everything that can be checked before the store is, and is exit 64:
	// never --fail-open.
	if err := dlock.ValidateKey(key); err != nil {
		return invalid(err)
	}
	if err := dlock.ValidateTTL(f.ttl); err != nil {
		return invalid(fmt.Errorf("%s: %w", g.flagName("ttl"), err))
	}
	if err := dlock.ValidateHolder(f.holder); err != nil {
		return invalid(fmt.Errorf("%s: %w", g.flagName("holder"), err))
	}
	switch {
	case f.grace < 0 || f.waitTimeout < 0:
		return invalid(fmt.Errorf("--grace and --wait-timeout must not be negative"))
	case f.retryFor < 0:
		return invalid(fmt.Errorf("%s must not be negative, not %v", g.flagName("retry-for"), f.retryFor))
	case f.cgroup != "auto" && f.cgroup != "off":
		return invalid(fmt.Errorf("--cgroup must be auto or off, not %q", f.cgroup))
	case f.permits < 0 || f.permits > MaxPermits:
		return invalid(fmt.Errorf("--permits must be 0 (a plain lock) to %d, not %d", MaxPermits, f.permits))
	case f.conflictCode < 0 || f.conflictCode > 255:
		return invalid(fmt.Errorf("--conflict-exit-code must be 0 to 255, not %d", f.conflictCode))
	}
	if err := f.once.validate(f); err != nil {
		return invalid(err)
	}
	if err := f.resume.validate(f); err != nil {
		return invalid(err)
	}
	if f.permits > 0 {
		if err := dlock.ValidateKey(PermitKey(key, f.permits-1)); err != nil {
			return invalid(fmt.Errorf("--permits: the slot key %q: %w", PermitKey(key, f.permits-1), err))
		}
	}
	if err := g.checkStore(); err != nil {
		return invalid(err)
	}

	// --fail-open is applied here, not by the library: whenever the outcome
	// would be exit 69 (the store could not be reached, whatever
	// --wait, --wait-timeout and --retry-for say), never for 64 or 75.
	opts := []dlock.Option{dlock.WithTTL(f.ttl), dlock.WithHolder(f.holder), dlock.WithKeyClass("cli")}
	// How long a store that cannot be reached is retried: --retry-for
	// without --wait; with --wait the whole wait unless --retry-for is given.
	retried := f.retryFor
	if !f.wait || retrySet {
		opts = append(opts, dlock.WithRetryFor(f.retryFor))
	} else if retried = f.waitTimeout; retried == 0 {
		retried = -1 // until the wait ends
	}
	// The first retry of an unreachable store is said on stderr, once.
	var sayOnce atomic.Bool
	sayRetrying := func(cause error) {
		if sayOnce.Swap(true) {
			return
		}
		budget := fmt.Sprintf("for up to %v (--retry-for)", f.retryFor)
		switch {
		case retried < 0:
			budget = "until the key is granted or the wait is interrupted"
		case f.wait && !retrySet:
			budget = fmt.Sprintf("for up to %v (--wait-timeout)", retried)
		}
		fmt.Fprintf(g.stderr, "dlock: acquire %q: cannot reach the store at %s (%s); retrying %s\n", key, g.storeAddr(), plainCause(cause), budget)
	}
	// The supervisor learns of every renewal at once: it terminates the
	// command when the validity deadline passes unrenewed.
	renewed := &renewObserver{retry: func(e dlock.RetryEvent) { sayRetrying(e.Err) }}
	if g.debug {
		renewed.debugf = func(format string, args ...any) {
			fmt.Fprintf(g.stderr, "dlock: debug: "+format+"\n", args...)
		}
	}
	opts = append(opts, dlock.WithObserver(renewed))
	opts = append(opts, f.resume.options()...) // --max-hold (resume.go)

	// From here on SIGINT, SIGTERM and SIGHUP never kill dlock: before the
	// command runs they end the store calls and the wait (exit 128+N); once
	// it runs they are forwarded to it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	actx, acancel := context.WithCancelCause(ctx)
	defer acancel(nil)
	// startWatch turns the first of those signals into actx's cause, until
	// endWatch, which returns that signal as an interrupted error, if any.
	var stopWatch, watchDone chan struct{}
	startWatch := func() {
		stop, done := make(chan struct{}), make(chan struct{})
		stopWatch, watchDone = stop, done
		go func() {
			defer close(done)
			select {
			case s := <-sigs:
				acancel(interrupted{s.(syscall.Signal)})
			case <-stop:
			}
		}()
	}
	endWatch := func() error {
		close(stopWatch)
		<-watchDone
		var intr interrupted
		if errors.As(context.Cause(actx), &intr) {
			return intr
		}
		return nil
	}
	startWatch()
	locker, err := g.openRetrying(actx, retried, sayRetrying)
	if intr := endWatch(); intr != nil {
		if locker != nil {
			_ = locker.Close()
		}
		return report(128+int(intr.(interrupted).sig), "interrupted", intr)
	}
	var lease *dlock.Lease
	permit := -1
	var ee *exitError
	// unavail is set when the outcome is "the store could not be reached":
	// exit 69, or with --fail-open the command runs without a lock.
	var unavail error
	switch {
	case err != nil && errors.As(err, &ee) && ee.code == ExitUsage:
		return invalid(ee.err)
	case err != nil && errors.As(err, &ee) && ee.code == ExitUnavailable && ee.detail != nil:
		unavail = g.unavailable("acquire", key, ee.detail, retried)
	case err != nil:
		unavail = err
	default:
		defer locker.Close()
		startWatch()
		lease, permit, err = f.resume.acquire(actx, g, locker, f, key, opts, func() (*dlock.Lease, int, error) { // --resume-file (resume.go)
			return acquire(actx, locker, f, key, opts, retrySet, sayRetrying)
		})
		defer f.resume.done()
		res.Resumed = f.resume.resumed
		if intr := endWatch(); intr != nil {
			_ = releaseLease(lease)
			return report(128+int(intr.(interrupted).sig), "interrupted", fmt.Errorf("%w: not run", intr))
		}
		var na *noAnswerError
		switch {
		case err == nil:
		case errors.Is(err, dlock.ErrPermissionDenied): // before ErrInvalidArgument, which it matches
			var ee *exitError
			errors.As(g.noPerm(err), &ee)
			return report(ExitNoPerm, "permission_denied", ee.err)
		case errors.Is(err, dlock.ErrInvalidArgument):
			return invalid(err)
		case errors.As(err, new(interrupted)):
			var intr interrupted
			errors.As(err, &intr)
			return report(128+int(intr.sig), "interrupted", err)
		case errors.As(err, &na):
			unavail = &exitError{code: ExitUnavailable, err: fmt.Errorf("acquire %q: --wait-timeout %v passed before the store at %s answered; not run", key, f.waitTimeout, g.storeAddr()), detail: na.err}
		case errors.Is(err, dlock.ErrUnavailable):
			unavail = g.unavailable("acquire", key, err, retried)
		case errors.Is(err, dlock.ErrNotAcquired):
			return report(heldCode, "held", heldMessage(ctx, g, locker, f, key, err))
		case errors.Is(err, dlock.ErrUnsupported):
			return report(ExitUnsupported, "unsupported", fmt.Errorf("acquire %q: %w (see the driver's docs for what each store can do)", key, err))
		default:
			return report(ExitUnavailable, "unavailable", fmt.Errorf("acquire %q: %w", key, err))
		}
	}
	if unavail != nil {
		if !f.failOpen {
			return report(ExitUnavailable, "unavailable", unavail)
		}
		cause := error(unavail)
		if errors.As(unavail, &ee) && ee.detail != nil {
			cause = ee.detail
		}
		fmt.Fprintf(g.stderr, "dlock: cannot reach the store at %s (%s); running %q WITHOUT a lock (--fail-open)\n", g.storeAddr(), plainCause(cause), key)
		if lease != nil {
			_ = releaseLease(lease)
			lease, permit = nil, -1
		}
	}

	env := append(childEnviron(os.Environ()), "DLOCK_KEY="+key, "DLOCK_STORE="+g.store)
	if lease != nil {
		res.Fence = lease.Fence()
		env = append(env, "DLOCK_FENCE="+strconv.FormatUint(lease.Fence(), 10))
	}
	if permit >= 0 {
		p := permit
		res.Permit, res.SlotKey = &p, PermitKey(key, permit)
		env = append(env, "DLOCK_PERMIT="+strconv.Itoa(permit), "DLOCK_PERMIT_KEY="+PermitKey(key, permit))
	} else if permit == nativePermit { // a native permit has no slot index (permits.go)
		res.SlotKey = permitLeaseKey(key, permit)
		env = append(env, "DLOCK_PERMIT_KEY="+res.SlotKey)
	}
	if stop, code, result, err := f.once.begin(actx, g, f, lease, &res); stop { // --once-per (once.go)
		_ = releaseLease(lease)
		return report(code, result, err)
	}
	env = append(env, f.once.env()...)
	leaseKey := key
	if permit >= 0 || permit == nativePermit {
		leaseKey = permitLeaseKey(key, permit)
	}
	// SIGINT, SIGTERM and SIGHUP (on sigs) are forwarded to the command's
	// group; dlock itself keeps running until the command ends, then
	// releases.

	cfg := supervise.Config{
		Argv: argv, Env: env, Stdin: g.stdin, Stdout: g.stdout, Stderr: g.stderr,
		Grace: f.grace, Cgroup: f.cgroup == "auto", NoCgroupReason: "--cgroup off",
		Warnf: func(format string, args ...any) {
			fmt.Fprintf(g.stderr, "dlock: "+format+"\n", args...)
		},
	}
	if g.debug {
		cfg.Debugf = func(format string, args ...any) { fmt.Fprintf(g.stderr, "dlock: debug: "+format+"\n", args...) }
	}
	var leaseDone <-chan struct{}
	if lease != nil && !lease.Degraded() {
		leaseDone = lease.Done()
		cfg.Deadline = lease.Deadline()
	}
	job, err := supervise.Start(cfg)
	if err != nil {
		_ = releaseLease(lease)
		code := ExitCannotRun
		var se *supervise.StartError
		if errors.As(err, &se) {
			code = se.Code
		}
		return report(code, "not_started", startError(code, argv, err))
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
			fmt.Fprint(g.stderr, f.resume.lostMessage(leaseKey, lostErr, f.grace)) // --max-hold says so (resume.go)
			job.Terminate()
			<-job.Done()
			_ = releaseLease(lease)
			return report(ExitLost, "lost", lostErr)
		case <-job.Done():
			r := job.Result()
			var left time.Duration
			if lease != nil {
				left = time.Until(lease.Deadline())
			}
			if err := f.once.end(g, lease, r); err != nil { // --once-per (once.go)
				_ = releaseLease(lease)
				return report(ExitLost, "lost", err)
			}
			relErr := releaseLease(lease)
			if r.Reason == supervise.ReasonDeadline {
				err := fmt.Errorf("lease on %q passed its validity deadline with no renewal (dlock was stopped or starved); the command was terminated", leaseKey)
				if errors.Is(relErr, dlock.ErrLeaseLost) {
					err = fmt.Errorf("%w: %w", err, relErr)
				}
				return report(ExitLost, "lost", err)
			}
			if errors.Is(relErr, dlock.ErrLeaseLost) {
				fmt.Fprintf(g.stderr, "dlock: lease on %q was lost just as the command ended: %v\n", leaseKey, relErr)
				return report(ExitLost, "lost", relErr)
			}
			if relErr != nil {
				// The command's status stands; the key stays held until the
				// store expires it. Say so, or the next run's 75 is a mystery.
				// A store that was down or restarting may restart the
				// countdown (dlockd does, at full TTL) when it is back: then
				// the bound is the TTL from then, not the time left now.
				var why, until string
				if errors.Is(relErr, dlock.ErrUnavailable) {
					why = fmt.Sprintf("cannot reach the store at %s (%s)", g.storeAddr(), plainCause(relErr))
					until = fmt.Sprintf("at most its TTL (%v) after the store is reachable again", f.ttl)
					res.KeyHeldUpTo, res.KeyHeldFrom = f.ttl.Seconds(), "store_reachable_again"
				} else {
					why = fmt.Sprintf("the store at %s refused the release (%v)", g.storeAddr(), strings.TrimPrefix(relErr.Error(), "dlock: "))
					until = fmt.Sprintf("up to %v from now (TTL %v)", max(left, 0).Round(time.Second), f.ttl)
					res.KeyHeldUpTo, res.KeyHeldFrom = max(left, 0).Seconds(), "now"
				}
				fmt.Fprintf(g.stderr, "dlock: warning: could not release %q (fence %d): %s; it stays held until the store expires it, %s\n",
					leaseKey, lease.Fence(), why, until)
				res.ReleaseError = fmt.Sprintf("could not release %q (fence %d): %s", leaseKey, lease.Fence(), why)
				res.ReleaseDetail = strings.TrimPrefix(relErr.Error(), "dlock: ")
			}
			result := "ran"
			if lease == nil || lease.Degraded() {
				result = "fail_open"
			}
			return report(r.Code, result, nil)
		}
	}
}

// heldMessage says who holds key (or that all its permits are taken), for
// the "held" exit, asking the store where it can tell.
func heldMessage(ctx context.Context, g *globals, l *dlock.Locker, f *runFlags, key string, err error) error {
	suffix := "not run"
	if f.wait {
		suffix = fmt.Sprintf("still held after --wait-timeout %v; not run", f.waitTimeout)
	} else {
		suffix = "not run (--wait or --wait-timeout to wait for it)"
	}
	if f.permits > 0 {
		return fmt.Errorf("run %q: all %d permits (%s) are held; %s", key, f.permits, permitKeys(l, key, f.permits), suffix)
	}
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	info, ierr := l.Inspect(ictx, key)
	if ierr != nil {
		return fmt.Errorf("run %q: the key is held; %s", key, suffix)
	}
	who := "an unnamed holder"
	if info.Holder != "" {
		who = quoteIfControl(info.Holder)
	}
	left := ""
	if info.Remaining > 0 {
		left = fmt.Sprintf(" for %v more", info.Remaining.Round(100*time.Millisecond))
		if info.TTL > 0 {
			left += fmt.Sprintf(" (TTL %v)", info.TTL)
		}
	}
	return fmt.Errorf("run %q: held by %s%s, fence %d; %s", key, who, left, info.Fence, suffix)
}

// renewObserver calls on after each confirmed renewal; dlock run uses it to
// pass the lease's new validity deadline to the supervisor at once. It also
// passes each retry of an unreachable store to retry (when set) and, with
// --debug, to debugf.
type renewObserver struct {
	on     atomic.Pointer[func()]
	retry  func(e dlock.RetryEvent)
	debugf func(format string, args ...any)
}

// AcquireRetry implements dlock.RetryObserver.
func (o *renewObserver) AcquireRetry(e dlock.RetryEvent) {
	if o.retry != nil {
		o.retry(e)
	}
	if o.debugf != nil {
		o.debugf("retry %d after %v, next in %v: %v", e.Attempt, e.Elapsed.Round(time.Millisecond), e.Backoff.Round(time.Millisecond), e.Err)
	}
}

func (o *renewObserver) AcquireDone(dlock.AcquireEvent) {}
func (o *renewObserver) LeaseEnded(dlock.EndEvent)      {}
func (o *renewObserver) Renewed(e dlock.RenewEvent) {
	if f := o.on.Load(); f != nil && e.Err == nil {
		(*f)()
	}
}

// acquire takes key (or, with --permits, one of its slots), waiting under
// --wait; it returns the lease and the slot index (-1 without --permits).
func acquire(ctx context.Context, l *dlock.Locker, f *runFlags, key string, opts []dlock.Option, retrySet bool, onOutage func(error)) (*dlock.Lease, int, error) {
	if !f.wait {
		if f.permits > 0 {
			return tryPermits(ctx, l, f, key, opts)
		}
		lease, err := l.TryAcquire(ctx, key, opts...)
		return lease, -1, err
	}
	pctx := ctx
	if f.waitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.waitTimeout)
		defer cancel()
	}
	// One attempt first, whatever --wait-timeout (flock -w with a tiny
	// timeout acts as -n): bounded by the store's op timeout, not by the
	// wait, and without retries, so that a store that answers at once is
	// asked at least once.
	once := append(opts[:len(opts):len(opts)], dlock.WithRetryFor(0))
	var lease *dlock.Lease
	permit := -1
	var err error
	if f.permits > 0 {
		lease, permit, err = tryPermits(pctx, l, f, key, once)
	} else {
		lease, err = l.TryAcquire(pctx, key, once...)
	}
	saidHeld := errors.Is(err, dlock.ErrNotAcquired)
	switch {
	case err == nil:
		return lease, permit, nil
	case !saidHeld && !errors.Is(err, dlock.ErrUnavailable):
		// invalid input, or interrupted: the wait cannot change it
	case ctx.Err() == nil:
		// Held, or the store could not be reached: wait (and retry) for
		// what is left of --wait-timeout. A signal cancels ctx with cause
		// interrupted (see runUnderLease); dlock then exits 128+N, as the
		// shell reports a command killed by signal N.
		if f.permits > 0 {
			lease, permit, err = waitPermits(ctx, l, f, key, opts, !retrySet, onOutage)
		} else {
			lease, err = l.Acquire(ctx, key, opts...)
		}
		if err != nil && errors.Is(err, context.DeadlineExceeded) &&
			!errors.Is(err, dlock.ErrNotAcquired) && !errors.Is(err, dlock.ErrUnavailable) {
			if saidHeld {
				err = fmt.Errorf("%w (%w)", err, dlock.ErrNotAcquired)
			} else {
				// The wait ended with no answer from the store: never "held".
				err = &noAnswerError{err: err}
			}
		}
	case saidHeld:
		err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	}
	var intr interrupted
	if err != nil && errors.As(context.Cause(ctx), &intr) {
		return nil, -1, fmt.Errorf("%w: %w", intr, err)
	}
	return lease, permit, err
}

// noAnswerError: --wait-timeout passed before the store answered at all.
type noAnswerError struct{ err error }

func (e *noAnswerError) Error() string {
	return "no answer from the store before --wait-timeout: " + e.err.Error()
}
func (e *noAnswerError) Unwrap() error { return e.err }

// tryPermits and waitPermits (--permits, on package semaphore) are in permits.go.

// openRetrying opens the store, retrying an unreachable one for up to
// retryFor (0: once; negative: until ctx ends); retrying is told of each
// failure that is retried.
func (g *globals) openRetrying(ctx context.Context, retryFor time.Duration, retrying func(cause error)) (*dlock.Locker, error) {
	deadline := time.Now().Add(retryFor)
	for {
		l, err := g.open(ctx)
		var ee *exitError
		if err == nil || !errors.As(err, &ee) || ee.code != ExitUnavailable || retryFor == 0 || (retryFor > 0 && time.Now().After(deadline)) {
			return l, err
		}
		cause := error(ee)
		if ee.detail != nil {
			cause = ee.detail
		}
		retrying(cause)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(jittered(200 * time.Millisecond)):
		}
	}
}

// interrupted is the cause of a wait ended by a signal.
type interrupted struct{ sig syscall.Signal }

func (i interrupted) Error() string {
	name := map[syscall.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGHUP: "SIGHUP"}[i.sig]
	if name == "" {
		name = i.sig.String()
	}
	return "interrupted by " + name
}

// releaseLease releases lease (nil or degraded: nothing to do) within 10s.
func releaseLease(lease *dlock.Lease) error {
	if lease == nil || lease.Degraded() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return lease.Release(ctx)
}

// startError says in plain words why the command could not be started.
func startError(code int, argv []string, err error) error {
	name := argv[0]
	switch {
	case code == ExitNotFound:
		return fmt.Errorf("command not found: %s", quoteIfControl(name))
	case strings.Contains(err.Error(), "permission denied"):
		return fmt.Errorf("cannot run %s: permission denied (is it executable?)", quoteIfControl(name))
	}
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(msg, "fork/exec ") {
		msg = rest
	}
	return fmt.Errorf("cannot run %s: %s", quoteIfControl(name), msg)
}

// secretEnv lists the environment variables dlock reads that carry a
// credential: they are not passed on to the command dlock run starts.
var secretEnv = []string{"DLOCK_TOKEN"}

// childEnviron returns env (KEY=VALUE entries) without the variables of
// secretEnv.
func childEnviron(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(secretEnv, k) {
			continue
		}
		out = append(out, kv)
	}
	return out
}
