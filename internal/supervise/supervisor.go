package supervise

// supervisor.go is the supervisor process: dlock's own binary re-executed
// with envConfig set. It starts the command, forwards signals, watches the
// lease's validity deadline, and kills and reaps everything the command
// started before it exits with the command's status.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// envConfig marks a supervisor: its value is the JSON wireConfig. The
// supervisor removes it from its environment before it starts the command.
const envConfig = "_DLOCK_SUPERVISOR"

// Descriptors dlock passes to the supervisor.
const (
	fdControl = 3 // dlock → supervisor: 9-byte messages; EOF when dlock is gone
	fdStatus  = 4 // supervisor → dlock: lines
)

// Control messages: one opcode byte and a big-endian int64.
const (
	opSignal   = 's' // forward signal N to the command's process group
	opLost     = 'l' // the lease is lost: SIGTERM everything, SIGKILL after the grace
	opDeadline = 'd' // the lease's validity deadline moved (CLOCK_MONOTONIC ns; 0: none)
	opContinue = 'c' // dlock was continued (SIGCONT): continue the command, in the foreground if dlock has it
)

// Reasons a supervised command ended, reported to dlock in the exit line.
const (
	ReasonExited   = "exited"   // the command ended on its own
	ReasonLost     = "lost"     // dlock reported the lease lost; the command was terminated
	ReasonDeadline = "deadline" // the lease's validity deadline passed with no word from dlock (dlock stopped or starved); the command was terminated
	ReasonParent   = "parent"   // dlock died; the command was terminated (no one reads this one)
	// ReasonSupervisorDied: the supervisor ended without reporting (it was
	// killed); dlock killed the command's process group and cgroup itself.
	ReasonSupervisorDied = "supervisor_died"
)

type wireConfig struct {
	Grace    time.Duration `json:"grace"`
	Deadline int64         `json:"deadline,omitempty"`  // CLOCK_MONOTONIC ns; 0: none
	Cgroup   string        `json:"cgroup,omitempty"`    // the run's cgroup directory; "": none
	NoCgroup string        `json:"no_cgroup,omitempty"` // why there is none
	// Foreground is dlock's process group when stdin (descriptor 0) is the
	// terminal whose foreground group it is: the command gets the
	// foreground, and it goes back to this group at the end. 0: none.
	Foreground int `json:"foreground,omitempty"`
}

func init() {
	if v, ok := os.LookupEnv(envConfig); ok {
		_ = os.Unsetenv(envConfig)
		os.Exit(supervise(v, os.Args[1:]))
	}
}

type supervisor struct {
	cfg    wireConfig
	status io.Writer
	self   int
	cg     *cgroup

	pid int // the command's PID, also its process group ID
	// tty is true when the command was given the terminal's foreground
	// (cfg.Foreground), which goes back to dlock's group at the end.
	tty bool

	// mu is held while signalling by PID and while reaping, so that no PID
	// signalled is reaped (and reusable) in between.
	mu        sync.Mutex
	jobExit   chan syscall.WaitStatus // the command's status, once
	jobStop   chan syscall.Signal     // the terminal stop signal that stopped the command (with tty)
	allReaped chan struct{}           // closed when the supervisor has no children left
}

func (s *supervisor) report(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	_, _ = io.WriteString(s.status, strings.ReplaceAll(line, "\n", " ")+"\n")
}

// supervise runs the supervisor and returns its exit status: the command's
// (128+N when a signal ended it).
func supervise(conf string, argv []string) int {
	setName("dlock-supervise")
	var cfg wireConfig
	if err := json.Unmarshal([]byte(conf), &cfg); err != nil || len(argv) == 0 {
		fmt.Fprintf(os.Stderr, "dlock: %s is set but this is not a supervisor started by dlock run (%v)\n", envConfig, err)
		return 64
	}
	var st syscall.Stat_t
	if syscall.Fstat(fdControl, &st) != nil || syscall.Fstat(fdStatus, &st) != nil {
		fmt.Fprintf(os.Stderr, "dlock: %s is set but descriptors 3 and 4 are not open\n", envConfig)
		return 64
	}
	syscall.CloseOnExec(fdControl)
	syscall.CloseOnExec(fdStatus)
	s := &supervisor{
		cfg: cfg, status: os.NewFile(fdStatus, "status"), self: os.Getpid(),
		jobExit: make(chan syscall.WaitStatus, 1), jobStop: make(chan syscall.Signal, 1),
		allReaped: make(chan struct{}),
	}
	if cfg.Cgroup != "" {
		s.cg = &cgroup{dir: cfg.Cgroup}
	}
	subreaper := "subreaper"
	if err := setSubreaper(); err != nil {
		subreaper = fmt.Sprintf("no subreaper (%v)", err)
	}

	// Signals sent to the supervisor itself go to the command, as dlock's do.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)

	mode, err := s.start(argv)
	if err != nil {
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		if s.cg != nil {
			_ = s.cg.remove()
		}
		s.report("error %d %v", code, err)
		return code
	}
	s.report("mode %s, %s", mode, subreaper)
	if s.tty {
		s.report("debug the command's process group %d has the terminal's foreground", s.pid)
	}
	s.report("started %d", s.pid)
	go s.reap()

	ctl := make(chan [9]byte)
	go readControl(os.NewFile(fdControl, "control"), ctl)
	code, reason := s.run(ctl, sigs)
	if s.tty {
		// Everything the command started is gone: the terminal goes back
		// to dlock's group before dlock learns that the command ended (it
		// may be gone too, when dlock died: then the shell takes it).
		if err := reclaimForeground(0, s.cfg.Foreground, s.pid); err != nil {
			s.report("debug giving the terminal back to process group %d: %v", s.cfg.Foreground, err)
		}
	}
	s.report("exit %d %s", code, reason)
	return code
}

// start starts the command in its own process group, in the cgroup when
// there is one, and says how it is contained.
func (s *supervisor) start(argv []string) (mode string, err error) {
	path := argv[0]
	if !strings.Contains(path, "/") { // as exec.Command does
		if path, err = exec.LookPath(path); err != nil {
			return "", err
		}
	}
	attr := &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
		// Pdeathsig: if the supervisor itself is SIGKILLed, the kernel
		// kills the command (not what it started; the cgroup covers that).
		Sys: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	}
	if s.cg != nil {
		fd, oerr := s.cg.open()
		if oerr == nil {
			attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = true, fd
			s.pid, err = s.forkExec(path, argv, attr)
			syscall.Close(fd)
			if err == nil {
				kill := "cgroup.kill"
				if _, serr := os.Stat(s.cg.dir + "/cgroup.kill"); serr != nil {
					kill = "signals to each PID (no cgroup.kill)"
				}
				return fmt.Sprintf("cgroup v2 %s (killed by %s), process group %d", s.cg.dir, kill, s.pid), nil
			}
		}
		// Retry outside the cgroup: CLONE_INTO_CGROUP may be refused
		// (Linux < 5.7, a cgroup that cannot take processes); when the
		// command itself cannot be executed, the retry fails the same way.
		cgErr := err
		if oerr != nil {
			cgErr = oerr
		}
		attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = false, 0
		if s.pid, err = s.forkExec(path, argv, attr); err != nil {
			return "", &os.PathError{Op: "fork/exec", Path: path, Err: err}
		}
		_ = s.cg.remove()
		s.cg = nil
		return fmt.Sprintf("no cgroup (starting in %s failed: %v), process group %d", s.cfg.Cgroup, cgErr, s.pid), nil
	}
	if s.pid, err = s.forkExec(path, argv, attr); err != nil {
		return "", &os.PathError{Op: "fork/exec", Path: path, Err: err}
	}
	return fmt.Sprintf("no cgroup (%s), process group %d", s.cfg.NoCgroup, s.pid), nil
}

// forkExec starts the command; with cfg.Foreground, in the terminal's
// foreground (the child takes it before exec, see terminal.go). When that
// fails (the terminal is gone, or not the controlling terminal any more),
// it starts the command as a background group, as without a terminal, and
// says why.
func (s *supervisor) forkExec(path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if s.cfg.Foreground != 0 {
		fg := *attr.Sys
		fg.Foreground, fg.Ctty = true, 0 // the terminal is descriptor 0, in both processes
		a := *attr
		a.Sys = &fg
		pid, err := syscall.ForkExec(path, argv, &a)
		if err == nil {
			s.tty = true
			return pid, nil
		}
		// The child may have taken the foreground before its exec failed.
		_ = setForeground(0, s.cfg.Foreground)
		s.report("debug starting the command in the terminal's foreground failed (%v); starting it in the background", err)
	}
	return syscall.ForkExec(path, argv, attr)
}

// reap reaps every child of the supervisor (the command, and the orphans
// re-parented to it as subreaper) until none is left. With the terminal
// given to the command, it also reports the command stopped by a terminal
// stop signal (Ctrl-Z), which run passes on to dlock's group.
func (s *supervisor) reap() {
	defer close(s.allReaped)
	flags := syscall.WNOHANG | syscall.WALL
	if s.tty {
		flags |= syscall.WUNTRACED
	}
	for {
		if err := awaitChild(s.tty); err != nil {
			return // ECHILD: no children left
		}
		s.mu.Lock()
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, flags, nil)
			if err != nil || pid <= 0 {
				break
			}
			switch {
			case ws.Stopped():
				if pid == s.pid && isTerminalStop(ws.StopSignal()) {
					select {
					case s.jobStop <- ws.StopSignal():
					default:
					}
				}
			case pid == s.pid:
				s.jobExit <- ws
			}
		}
		s.mu.Unlock()
	}
}

func readControl(f *os.File, ctl chan<- [9]byte) {
	defer close(ctl)
	for {
		var m [9]byte
		if _, err := io.ReadFull(f, m[:]); err != nil {
			return // EOF: dlock is gone
		}
		ctl <- m
	}
}

// run waits for the command to end, or for a reason to end it, and returns
// its exit status and the reason it ended.
func (s *supervisor) run(ctl <-chan [9]byte, sigs <-chan os.Signal) (int, string) {
	reason := ReasonExited
	deadline := s.cfg.Deadline
	var watchdog <-chan time.Time
	var wdTimer *time.Timer
	setWatchdog := func() {
		if wdTimer != nil {
			wdTimer.Stop()
		}
		watchdog = nil
		if deadline != 0 {
			wdTimer = time.NewTimer(time.Duration(deadline - monoNow()))
			watchdog = wdTimer.C
		}
	}
	setWatchdog()

	var killAt <-chan time.Time
	var killTimer *time.Timer
	var killWhen time.Time
	// terminate sends SIGTERM (and SIGCONT, for stopped processes) to
	// everything the command started and schedules SIGKILL in killIn; when
	// already terminating, it can only bring the SIGKILL forward.
	terminate := func(why string, killIn time.Duration) {
		killIn = max(killIn, 0)
		if reason != ReasonExited {
			if when := time.Now().Add(killIn); when.Before(killWhen) {
				killTimer.Reset(killIn)
				killWhen = when
			}
			return
		}
		reason = why
		n := s.signalAll(syscall.SIGTERM)
		s.signalAll(syscall.SIGCONT)
		s.report("debug %s: SIGTERM to process group %d and %d other processes; SIGKILL in %v", why, s.pid, n, killIn)
		killWhen = time.Now().Add(killIn)
		killTimer = time.NewTimer(killIn)
		killAt = killTimer.C
	}

	var ws syscall.WaitStatus
	exited := false
loop:
	for {
		select {
		case m, ok := <-ctl:
			if !ok { // dlock died: the lease is good until its deadline at most
				ctl = nil
				killIn := s.cfg.Grace
				if deadline != 0 {
					killIn = min(killIn, time.Duration(deadline-monoNow()))
				}
				terminate(ReasonParent, killIn)
				continue
			}
			arg := int64(binary.BigEndian.Uint64(m[1:]))
			switch m[0] {
			case opSignal:
				_ = syscall.Kill(-s.pid, syscall.Signal(arg))
			case opLost:
				terminate(ReasonLost, s.cfg.Grace)
			case opDeadline:
				if reason == ReasonExited {
					deadline = arg
					setWatchdog()
				}
			case opContinue:
				if reason == ReasonExited && s.tty {
					s.resume()
				}
			}
		case sig := <-s.jobStop:
			if reason == ReasonExited {
				s.suspend(sig)
			}
		case <-watchdog:
			watchdog = nil
			terminate(ReasonDeadline, s.cfg.Grace)
		case sig := <-sigs:
			_ = syscall.Kill(-s.pid, sig.(syscall.Signal))
		case ws = <-s.jobExit:
			exited = true
			break loop
		case <-killAt:
			break loop
		}
	}
	if wdTimer != nil {
		wdTimer.Stop()
	}
	if killTimer != nil {
		killTimer.Stop()
	}

	// The command has ended, or its time is up: SIGKILL whatever is left
	// until nothing is (bounded: a process stuck in uninterruptible sleep
	// dies when it wakes, with SIGKILL pending).
	give := time.Now().Add(10 * time.Second)
	for {
		n := s.signalAll(syscall.SIGKILL)
		if !exited {
			select {
			case ws = <-s.jobExit:
				exited = true
			default:
			}
		}
		done := false
		select {
		case <-s.allReaped:
			done = s.cg == nil || !s.cg.populated()
		default:
		}
		if done {
			break
		}
		if time.Now().After(give) {
			s.report("warn %d processes of the command survived SIGKILL for 10s; giving up", n)
			break
		}
		select {
		case <-s.allReaped:
		case ws = <-s.jobExit:
			exited = true
		case <-time.After(20 * time.Millisecond):
		}
	}
	if !exited { // reaped just before allReaped was closed
		select {
		case ws = <-s.jobExit:
			exited = true
		default:
		}
	}
	if s.cg != nil {
		if err := s.cg.remove(); err != nil {
			s.report("warn %v", err)
		}
	}
	switch {
	case !exited:
		return 128 + int(syscall.SIGKILL), reason
	case ws.Signaled():
		return 128 + int(ws.Signal()), reason
	default:
		return ws.ExitStatus(), reason
	}
}

// suspend passes a terminal stop of the command (Ctrl-Z, or SIGTTIN or
// SIGTTOU once in the background) on to dlock's process group, as a shell's
// job: the terminal goes back to dlock's group, which is stopped with the
// same signal, so the shell that runs dlock sees its job stopped and takes
// the terminal. dlock does not renew its lease while stopped: if it stays
// stopped past the lease's deadline, the watchdog ends the command.
//
// When dlock's group is orphaned (no job-control shell above it, as when
// dlock leads its session: ssh -t host dlock run …), the kernel would
// discard the stop and nothing could continue the command: it is continued
// at once, in the foreground, and dlock says so.
func (s *supervisor) suspend(sig syscall.Signal) {
	if orphanedGroup(s.cfg.Foreground) {
		s.report("warn the command was stopped by %v, but no job-control shell runs dlock to resume it: continuing it", sig)
		if fg, err := tcgetpgrp(0); err == nil && (fg == s.cfg.Foreground || syscall.Kill(-fg, 0) == syscall.ESRCH) {
			_ = setForeground(0, s.pid) // else a read stops it again (SIGTTIN)
		}
		_ = syscall.Kill(-s.pid, syscall.SIGCONT)
		return
	}
	if fg, err := tcgetpgrp(0); err == nil && fg == s.pid { // not when in the background (bg)
		if err := setForeground(0, s.cfg.Foreground); err != nil {
			s.report("debug the command was stopped by %v; giving the terminal back to process group %d: %v", sig, s.cfg.Foreground, err)
		}
	}
	s.report("debug the command was stopped by %v: stopping dlock's process group %d", sig, s.cfg.Foreground)
	_ = syscall.Kill(-s.cfg.Foreground, sig)
}

// resume continues the command after dlock was continued: in the terminal's
// foreground when dlock's group has it (the shell's fg), else in the
// background (bg).
func (s *supervisor) resume() {
	if fg, err := tcgetpgrp(0); err == nil && fg == s.cfg.Foreground {
		if err := setForeground(0, s.pid); err != nil {
			s.report("debug giving the terminal to the command's process group %d: %v", s.pid, err)
		}
	}
	_ = syscall.Kill(-s.pid, syscall.SIGCONT)
}

// signalAll sends sig to the command's process group, to every process in
// its cgroup, and to every other descendant of the supervisor (daemons that
// left the group and were re-parented here). Each process gets sig once. It
// returns how many processes outside the group it signalled.
func (s *supervisor) signalAll(sig syscall.Signal) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = syscall.Kill(-s.pid, sig)
	done := map[int]bool{}
	n := 0
	if s.cg != nil {
		if sig != syscall.SIGKILL || s.cg.kill() != nil {
			for _, pid := range s.cg.procs() {
				if pgid, err := syscall.Getpgid(pid); err == nil && pgid != s.pid && !done[pid] {
					done[pid] = true
					if syscall.Kill(pid, sig) == nil {
						n++
					}
				}
			}
		}
	}
	select {
	case <-s.allReaped:
		return n // no children, so no descendants
	default:
	}
	for _, p := range descendants(s.self) {
		if p.pgrp != s.pid && !done[p.pid] {
			done[p.pid] = true
			if syscall.Kill(p.pid, sig) == nil {
				n++
			}
		}
	}
	return n
}
