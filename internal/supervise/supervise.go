// Package supervise runs dlock run's command under a small supervisor
// process, so that nothing the command started runs on without the lease.
//
// # Why
//
// Before, dlock run started the command in its own process group with
// Pdeathsig. When dlock was SIGKILLed (or OOM-killed), the kernel killed the
// command's first process only: its background children, and any daemon it
// had double-forked, ran on after the lease expired, beside the next holder.
//
// # Design
//
// Start re-executes the running binary (/proc/self/exe, so the supervisor is
// the same build as dlock) with envConfig set; this package's init sees the
// variable and runs the supervisor instead of main. The supervisor:
//
//   - is its own process group, so what is sent to dlock's group (the
//     terminal's Ctrl-C, timeout(1)'s SIGKILL) does not reach it; dlock
//     forwards SIGINT, SIGTERM and SIGHUP to it, and it to the command's
//     group, as dlock did before;
//   - when stdin is the terminal whose foreground dlock has, gives the
//     command's group that foreground before the command starts, and gives
//     it back to dlock's group when everything the command started is gone
//     (terminal.go): a command that reads the terminal is not stopped by
//     SIGTTIN, and the terminal's Ctrl-C reaches the command directly;
//   - is a child subreaper (PR_SET_CHILD_SUBREAPER): a process the command
//     daemonizes (fork, setsid, fork, parent exits) is re-parented to the
//     supervisor rather than to init, so the supervisor finds it in /proc,
//     kills it and reaps it;
//   - starts the command in its own process group and, when cgroup v2 is
//     writable, in a fresh child of dlock's own cgroup (CLONE_INTO_CGROUP,
//     so no fork escapes before the move), which it kills with cgroup.kill
//     and removes at the end;
//   - learns that dlock died from EOF on a pipe only dlock holds, that the
//     lease was lost from a message on it, and the lease's validity deadline
//     from messages after each renewal.
//
// It kills everything the command started (its group, its cgroup, every
// descendant of the supervisor): SIGKILL for what is left when the command
// ends; SIGTERM, then SIGKILL after the grace, when the lease is lost or its
// deadline passes with no renewal from dlock (dlock stopped or starved);
// SIGTERM, then SIGKILL after the grace or at the lease's deadline,
// whichever is first, when dlock dies. It waits until all of it is reaped
// (and the cgroup empty), then reports the command's status to dlock and
// exits with it (128+N for signal N).
//
// # What escapes
//
// Work that leaves both the process tree and the cgroup: processes started
// by another service on the command's behalf (systemd-run, at, a container
// runtime, sshd for ssh, any remote call). Without a writable cgroup, also
// what was re-parented elsewhere when the supervisor itself was SIGKILLed
// (dlock then kills the command's process group). The supervisor must be
// scheduled to act: a deadline is only as good as the machine's ability to
// run it.
package supervise

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config describes one supervised command.
type Config struct {
	// Argv is the command and its arguments; Argv[0] is looked up in the
	// PATH of Env when it has no slash, as exec.Command does.
	Argv []string
	// Env is the command's environment.
	Env []string
	// Stdin, Stdout and Stderr are passed as exec.Cmd passes them (an
	// *os.File directly).
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Grace is the time between SIGTERM and SIGKILL when the command is
	// terminated. Zero: SIGKILL at once.
	Grace time.Duration
	// Deadline is the lease's validity deadline (see dlock.Lease.Deadline);
	// the zero time means none (no lease, or a degraded one).
	Deadline time.Time
	// Cgroup asks for a cgroup v2 child of the caller's own cgroup; without
	// one (false, or not writable) the process group and the subreaper
	// remain.
	Cgroup bool
	// NoCgroupReason says why Cgroup is false, for the mode line.
	NoCgroupReason string
	// Debugf, when not nil, receives the supervisor's mode and actions.
	Debugf func(format string, args ...any)
	// Warnf, when not nil, receives the supervisor's warnings.
	Warnf func(format string, args ...any)
}

// StartError is Start's error when the command did not start: Code is 127
// when it was not found, else 126.
type StartError struct {
	Code int
	Err  error
}

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// Result is how a supervised command ended.
type Result struct {
	// Code is the command's exit status, 128+N when signal N ended it.
	Code int
	// Reason is one of the Reason constants.
	Reason string
}

// Job is a command running under a supervisor.
type Job struct {
	cmd    *exec.Cmd
	cg     *cgroup
	debugf func(string, ...any)
	warnf  func(string, ...any)

	mu  sync.Mutex
	ctl *os.File // nil once the supervisor is gone

	ttyFd   int // stdin, when it is the terminal whose foreground dlock gave the command
	ttyPgrp int // dlock's process group, to give that terminal back to; 0: none

	pid     int // the command's PID and process group; 0 until started
	started chan error
	done    chan struct{}
	res     Result
}

// Start starts cfg.Argv under a supervisor and returns once the command has
// started, or with a *StartError when it could not be.
func Start(cfg Config) (*Job, error) {
	nop := func(string, ...any) {}
	j := &Job{debugf: cfg.Debugf, warnf: cfg.Warnf, started: make(chan error, 1), done: make(chan struct{})}
	if j.debugf == nil {
		j.debugf = nop
	}
	if j.warnf == nil {
		j.warnf = nop
	}
	wc := wireConfig{Grace: cfg.Grace, NoCgroup: cfg.NoCgroupReason}
	// A terminal on stdin whose foreground dlock is: the command gets the
	// foreground (see terminal.go).
	j.ttyFd, j.ttyPgrp = foregroundOf(cfg.Stdin)
	wc.Foreground = j.ttyPgrp
	if !cfg.Deadline.IsZero() {
		wc.Deadline = monoNow() + int64(time.Until(cfg.Deadline))
	}
	if cfg.Cgroup {
		cg, err := newCgroup()
		if err != nil {
			wc.NoCgroup = fmt.Sprintf("cgroup v2 not writable: %v", err)
		} else {
			j.cg, wc.Cgroup = cg, cg.dir
		}
	}
	conf, _ := json.Marshal(wc)

	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, j.fail(&StartError{Code: 126, Err: err})
	}
	stR, stW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, j.fail(&StartError{Code: 126, Err: err})
	}
	env := append(cfg.Env[:len(cfg.Env):len(cfg.Env)], envConfig+"="+string(conf))
	j.cmd = &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       append([]string{"dlock-supervise"}, cfg.Argv...),
		Env:        env,
		Stdin:      cfg.Stdin,
		Stdout:     cfg.Stdout,
		Stderr:     cfg.Stderr,
		ExtraFiles: []*os.File{ctlR, stW}, // descriptors 3 and 4
		// Its own process group: what is sent to dlock's group does not
		// reach it. No Pdeathsig: it must outlive dlock to clean up.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
		// Only used when stdio is not an *os.File: do not wait forever for
		// an escaped process that keeps the output pipe open.
		WaitDelay: time.Second,
	}
	err = j.cmd.Start()
	ctlR.Close()
	stW.Close()
	if err != nil {
		ctlW.Close()
		stR.Close()
		return nil, j.fail(&StartError{Code: 126, Err: fmt.Errorf("starting the supervisor: %w", err)})
	}
	j.ctl = ctlW
	if j.ttyPgrp != 0 {
		go j.passContinue()
	}
	go j.watch(stR)
	if err := <-j.started; err != nil {
		<-j.done
		return nil, err
	}
	return j, nil
}

// passContinue tells the supervisor each time dlock is continued (SIGCONT,
// from the shell's fg or bg after a Ctrl-Z of the command stopped dlock's
// group), so that it continues the command, in the terminal's foreground
// when dlock has it; until the supervisor is gone.
func (j *Job) passContinue() {
	conts := make(chan os.Signal, 1)
	signal.Notify(conts, syscall.SIGCONT)
	defer signal.Stop(conts)
	for {
		select {
		case <-conts:
			j.send(opContinue, 0)
		case <-j.done:
			return
		}
	}
}

func (j *Job) fail(err error) error {
	if j.cg != nil {
		_ = j.cg.remove()
	}
	return err
}

// watch reads the supervisor's status lines until it exits, then cleans up
// after it if it died without reporting.
func (j *Job) watch(st *os.File) {
	startedSent := false
	start := func(err error) {
		if !startedSent {
			startedSent = true
			j.started <- err
		}
	}
	reported := false
	sc := bufio.NewScanner(st)
	for sc.Scan() {
		kind, rest, _ := strings.Cut(sc.Text(), " ")
		switch kind {
		case "mode":
			j.debugf("supervisor %d: %s", j.cmd.Process.Pid, rest)
		case "debug":
			j.debugf("supervisor %d: %s", j.cmd.Process.Pid, rest)
		case "warn":
			j.warnf("supervisor: %s", rest)
		case "started":
			j.pid, _ = strconv.Atoi(rest)
			start(nil)
		case "error":
			// The command could not be started (126, 127): the
			// supervisor reported it and exits with that status. Not a
			// supervisor failure, and nothing was started to kill.
			c, msg, _ := strings.Cut(rest, " ")
			code, _ := strconv.Atoi(c)
			j.res = Result{Code: code, Reason: ReasonExited}
			reported = true
			start(&StartError{Code: code, Err: errors.New(msg)})
		case "exit":
			c, reason, _ := strings.Cut(rest, " ")
			j.res.Code, _ = strconv.Atoi(c)
			j.res.Reason = reason
			reported = true
		}
	}
	st.Close()
	werr := j.cmd.Wait()
	j.mu.Lock()
	j.ctl.Close()
	j.ctl = nil
	j.mu.Unlock()
	if !reported {
		// The supervisor was killed (or crashed): the kernel killed the
		// command (Pdeathsig); kill what is left in its group and cgroup.
		if j.pid > 0 {
			_ = syscall.Kill(-j.pid, syscall.SIGKILL)
		}
		if j.cg != nil {
			if j.cg.kill() != nil {
				for _, pid := range j.cg.procs() {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		j.res = Result{Code: exitCode(j.cmd.ProcessState), Reason: ReasonSupervisorDied}
		if startedSent {
			j.warnf("the supervisor ended without reporting (%v); killed the command's process group and cgroup", werr)
		}
		start(&StartError{Code: 126, Err: fmt.Errorf("the supervisor ended before starting the command: %v", werr)})
	}
	if j.cg != nil {
		if err := j.cg.remove(); err != nil && !reported {
			j.warnf("%v", err)
		}
	}
	if j.ttyPgrp != 0 {
		// The supervisor gave the terminal back before reporting; when it
		// was killed first, dlock does.
		if err := reclaimForeground(j.ttyFd, j.ttyPgrp, j.pid); err != nil {
			j.warnf("could not take the terminal's foreground back from the command's process group: %v", err)
		}
	}
	close(j.done)
}

func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return 126
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func (j *Job) send(op byte, arg int64) {
	var m [9]byte
	m[0] = op
	binary.BigEndian.PutUint64(m[1:], uint64(arg))
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ctl != nil {
		_, _ = j.ctl.Write(m[:])
	}
}

// Signal forwards sig to the command's process group.
func (j *Job) Signal(sig syscall.Signal) { j.send(opSignal, int64(sig)) }

// Terminate ends the command because the lease is lost: SIGTERM to
// everything it started, SIGKILL after the grace.
func (j *Job) Terminate() { j.send(opLost, 0) }

// SetDeadline moves the lease's validity deadline; the supervisor
// terminates the command when it passes (as Terminate) unless moved again.
// The zero time removes it.
func (j *Job) SetDeadline(t time.Time) {
	var mono int64
	if !t.IsZero() {
		mono = monoNow() + int64(time.Until(t))
	}
	j.send(opDeadline, mono)
}

// Pid returns the command's PID, which is also its process group ID.
func (j *Job) Pid() int { return j.pid }

// Done is closed when the supervisor has exited: everything the command
// started is gone (or was given up on, with a warning).
func (j *Job) Done() <-chan struct{} { return j.done }

// Result returns how the command ended; valid after Done is closed.
func (j *Job) Result() Result {
	<-j.done
	return j.res
}
