package supervise

// terminal.go owns the terminal: whether dlock runs in the foreground of the
// terminal on its stdin, and handing that foreground to the command's
// process group and back.
//
// # Why
//
// The command runs in a process group of its own (so that the supervisor
// can signal everything it started), which is not the terminal's foreground
// group. A command that reads the terminal (sh -c 'read x', bash -i, a
// password prompt on stdin) was stopped by SIGTTIN, and stayed stopped while
// dlock renewed its lease forever: nothing ever continued it.
//
// # How
//
// When stdin is a terminal and dlock's process group is its foreground
// group (dlock runs in the foreground of an interactive shell), the
// supervisor starts the command with SysProcAttr.Foreground: the child
// makes its new group the terminal's foreground (TIOCSPGRP) before exec,
// with every signal blocked (so the kernel does not answer the background
// group's TIOCSPGRP with SIGTTOU), so the command never runs a single
// instruction outside the foreground. When everything the command started
// is gone (it exited, or was killed because the lease was lost or dlock
// died), the supervisor gives the foreground back to dlock's group before
// it reports the exit; dlock gives it back again, if needed, when the
// supervisor is gone (it was killed). Both do so with SIGTTOU blocked on
// the calling thread: they are background groups at that moment, and
// blocking (unlike ignoring) is not inherited by anything they start.
//
// # Signals from the terminal
//
// While the command has the foreground, the terminal's signals (Ctrl-C
// SIGINT, Ctrl-\ SIGQUIT, SIGWINCH, and SIGHUP on hangup) go to the
// command's group directly and no longer to dlock: each reaches the command
// once, and dlock's forwarding (of signals sent to dlock itself, e.g. by
// kill or a shell's SIGHUP to its jobs) does not add a second copy of a
// Ctrl-C.
//
// # Job control
//
// Ctrl-Z stops the command's group. The supervisor (waiting with
// WUNTRACED) passes the stop on as a shell's job would: it gives the
// terminal back to dlock's group and stops that group with the same signal,
// so the shell sees its job stopped and takes the terminal. On fg (or bg)
// the shell continues dlock's group; dlock tells the supervisor, which gives
// the terminal to the command's group again when dlock's group has it (fg,
// not bg) and continues it. A stopped dlock renews nothing: stopped past the
// lease's validity deadline, the command is terminated by the supervisor's
// watchdog, as for any stopped dlock, and dlock exits 70 when continued.
// At the end the terminal is given back to dlock's group only when the
// command's group (or a group with no process left) has it, never taken
// from a live group: the shell, after a Ctrl-Z.
//
// When stdin is not a terminal, or dlock runs in the background of its
// terminal, nothing changes: the command is a background group, as before.

import (
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// foregroundOf returns dlock's process group when f is a terminal whose
// foreground process group it is, and 0 otherwise (f is not an *os.File,
// not a terminal, not dlock's controlling terminal, or dlock is in the
// background).
func foregroundOf(in any) (fd, pgrp int) {
	f, ok := in.(*os.File)
	if !ok || f == nil {
		return -1, 0
	}
	fd = int(f.Fd())
	fg, err := tcgetpgrp(fd)
	if err != nil || fg != syscall.Getpgrp() {
		return -1, 0
	}
	return fd, fg
}

// setForeground makes pgrp the foreground process group of the terminal on
// fd (tcsetpgrp) with SIGTTOU blocked on the calling thread, so that a
// background caller is not stopped (or, catching it, looped) by the kernel.
// It does nothing when pgrp already is the foreground group.
func setForeground(fd, pgrp int) error {
	if fg, err := tcgetpgrp(fd); err == nil && fg == pgrp {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var block, old unix.Sigset_t
	sig, width := uint(syscall.SIGTTOU)-1, uint(unsafe.Sizeof(block.Val[0])*8)
	block.Val[sig/width] |= 1 << (sig % width)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &block, &old); err != nil {
		return err
	}
	err := unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, pgrp)
	_ = unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	return err
}

// tcgetpgrp returns the foreground process group of the terminal on fd; an
// error when fd is not the caller's controlling terminal.
func tcgetpgrp(fd int) (int, error) { return unix.IoctlGetInt(fd, unix.TIOCGPGRP) }

// reclaimForeground gives the terminal on fd back to pgrp (dlock's group)
// once the command is gone: when its foreground group is the command's own
// (cmd, which was killed), or any group with no process left (one the
// command made, such as a job of bash -i). A foreground group that is still
// alive is left alone: it is the shell that runs dlock, which took the
// terminal when dlock was stopped (Ctrl-Z), and must keep it.
func reclaimForeground(fd, pgrp, cmd int) error {
	fg, err := tcgetpgrp(fd)
	if err != nil {
		return err
	}
	if fg == pgrp || (fg != cmd && fg > 0 && syscall.Kill(-fg, 0) != syscall.ESRCH) {
		return nil
	}
	return setForeground(fd, pgrp)
}

// isTerminalStop reports whether sig is one of the stop signals the
// terminal sends (Ctrl-Z) or a background read or write of it causes.
func isTerminalStop(sig syscall.Signal) bool {
	return sig == syscall.SIGTSTP || sig == syscall.SIGTTIN || sig == syscall.SIGTTOU
}
