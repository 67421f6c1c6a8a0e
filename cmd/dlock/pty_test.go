package main_test

// Black-box tests of dlock run on a terminal (issue 13, item 5): a command
// that reads the terminal must get it, not be stopped by SIGTTIN while the
// lease is renewed forever; the terminal goes back to dlock's process group
// when the command ends, however it ends; Ctrl-C reaches the command once.
//
// Each test starts a non-interactive sh on a fresh pseudo-terminal, as its
// session leader and so the terminal's foreground process group; sh runs
// dlock in that group (it does no job control), as an interactive shell
// runs a foreground job, then reads the terminal itself. If dlock left the
// foreground with the command's (dead) group, that read would stop sh.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server/servertest"
)

// ttyState is a shell snippet that prints the calling shell's process group
// and its terminal's foreground group, from /proc (fields 5 and 8 of
// stat): equal when the shell has the terminal's foreground.
const ttyState = `set -- $(cat /proc/$$/stat); echo "pgrp=$5 tpgid=$8 ppid=$4"`

// terminal is a shell session on a pseudo-terminal.
type terminal struct {
	t      *testing.T
	cmd    *exec.Cmd
	master *os.File
	mu     sync.Mutex
	out    bytes.Buffer
	done   chan struct{} // closed when the output is drained (every slave closed)
}

// startTerminal runs script with sh on a new pseudo-terminal, with DLOCK set
// to the dlock binary and DLOCK_STORE to store.
func startTerminal(t *testing.T, store, script string) *terminal {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), "DLOCK="+dlockBin, "DLOCK_STORE="+store)
	master, err := pty.Start(cmd) // Setsid and Setctty: sh leads a session on the pty
	if err != nil {
		t.Fatal(err)
	}
	term := &terminal{t: t, cmd: cmd, master: master, done: make(chan struct{})}
	go func() {
		defer close(term.done)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			term.mu.Lock()
			term.out.Write(buf[:n])
			term.mu.Unlock()
			if err != nil {
				return // EIO once no process has the slave open
			}
		}
	}()
	t.Cleanup(func() {
		if term.cmd.ProcessState == nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
		master.Close()
		<-term.done
		if t.Failed() {
			t.Logf("terminal output:\n%s", term.output())
		}
	})
	return term
}

func (term *terminal) output() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.out.String()
}

// await waits up to 10 s for a line of output that matches re and returns
// its submatches.
func (term *terminal) await(re string) []string {
	term.t.Helper()
	rx := regexp.MustCompile(`(?m)` + re)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := rx.FindStringSubmatch(term.output()); m != nil {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
	term.t.Fatalf("no output matching %q within 10s; output:\n%s", re, term.output())
	return nil
}

// typeIn writes s to the terminal, as typed at the keyboard.
func (term *terminal) typeIn(s string) {
	term.t.Helper()
	if _, err := term.master.WriteString(s); err != nil {
		term.t.Fatal(err)
	}
}

// foreground returns the terminal's foreground process group (tcgetpgrp,
// which Linux answers on the master side too).
func (term *terminal) foreground() int {
	term.t.Helper()
	pg, err := unix.IoctlGetInt(int(term.master.Fd()), unix.TIOCGPGRP)
	if err != nil {
		term.t.Fatalf("TIOCGPGRP: %v", err)
	}
	return pg
}

// wait waits up to 10 s for the shell to exit 0.
func (term *terminal) wait() {
	term.t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- term.cmd.Wait() }()
	select {
	case err := <-errc:
		if err != nil {
			term.t.Fatalf("shell on the terminal: %v", err)
		}
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-term.cmd.Process.Pid, syscall.SIGKILL)
		<-errc
		term.t.Fatalf("shell on the terminal still running after 10s")
	}
}

// wantForegroundBack checks, after dlock exited, that the terminal's
// foreground is the shell's group again (dlock's group, which it shares),
// and that the shell can read the terminal.
func (term *terminal) wantForegroundBack() {
	term.t.Helper()
	if fg := term.foreground(); fg != term.cmd.Process.Pid {
		term.t.Fatalf("after dlock: the terminal's foreground group is %d, want dlock's (the shell's) %d", fg, term.cmd.Process.Pid)
	}
	term.typeIn("bye\n")
	term.await(`^after:bye\r?$`)
	term.wait()
}

// wantForegroundCommand checks a ttyState line of the command's: it had the
// terminal's foreground, in a group that is not dlock's.
func (term *terminal) wantForegroundCommand(m []string) {
	term.t.Helper()
	if m[1] != m[2] {
		term.t.Fatalf("the command's group %s is not the terminal's foreground (%s)", m[1], m[2])
	}
	if m[1] == strconv.Itoa(term.cmd.Process.Pid) {
		term.t.Fatalf("the command runs in dlock's process group %s, want one of its own", m[1])
	}
}

// after is the end of every script: dlock's exit code, then a read of the
// terminal by the shell that ran dlock.
const after = `; echo "rc=$?"; read y; echo "after:$y"`

func dlockdStore(t *testing.T) string {
	return "dlockd://" + servertest.StartProcess(t).Addr()
}

// TestRun_TerminalCommandReads: an interactive command reads what is typed
// and ends; the terminal is dlock's again afterwards.
func TestRun_TerminalCommandReads(t *testing.T) {
	term := startTerminal(t, dlockdStore(t),
		`"$DLOCK" run pty:read -- sh -c '`+ttyState+`; read x; echo "got:$x"'`+after)
	term.wantForegroundCommand(term.await(`^pgrp=(\d+) tpgid=(\d+)`))
	term.typeIn("hello\n")
	term.await(`^got:hello\r?$`)
	term.await(`^rc=0\r?$`)
	term.wantForegroundBack()
}

// TestRun_TerminalCtrlCEndsCommand: Ctrl-C ends a command that has the
// terminal, and dlock exits 130 as the shell reports a command ended by
// SIGINT.
func TestRun_TerminalCtrlCEndsCommand(t *testing.T) {
	term := startTerminal(t, dlockdStore(t),
		`"$DLOCK" run pty:int -- sh -c '`+ttyState+`; read x; echo "got:$x"'`+after)
	term.wantForegroundCommand(term.await(`^pgrp=(\d+) tpgid=(\d+)`))
	term.typeIn("\x03")
	term.await(`^(?:\^C)?rc=130\r?$`) // the terminal echoes ^C
	if strings.Contains(term.output(), "got:") {
		t.Fatalf("the command read a line after Ctrl-C")
	}
	term.wantForegroundBack()
}

// TestRun_TerminalCtrlCReachesCommandOnce: the terminal sends Ctrl-C's
// SIGINT to the command's group only; dlock, not in the foreground, does
// not forward a second copy.
func TestRun_TerminalCtrlCReachesCommandOnce(t *testing.T) {
	stop := filepath.Join(t.TempDir(), "stop")
	term := startTerminal(t, dlockdStore(t), fmt.Sprintf(
		`"$DLOCK" run pty:once -- sh -c 'trap "echo trapped-INT" INT; `+ttyState+`; while [ ! -e %s ]; do sleep 0.05; done; echo done'`+after, stop))
	term.wantForegroundCommand(term.await(`^pgrp=(\d+) tpgid=(\d+)`))
	term.typeIn("\x03")
	term.await(`^(?:\^C)?trapped-INT\r?$`) // the terminal echoes ^C
	time.Sleep(500 * time.Millisecond)     // room for a second copy to arrive
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	term.await(`^rc=0\r?$`)
	if n := len(regexp.MustCompile(`(?m)^(?:\^C)?trapped-INT\r?$`).FindAllString(term.output(), -1)); n != 1 {
		t.Fatalf("the command trapped SIGINT %d times for one Ctrl-C, want once", n)
	}
	term.wantForegroundBack()
}

// TestRun_TerminalLostLeaseGivesTerminalBack: when the lease is lost while
// the command has the terminal, the command is terminated, dlock exits 70
// and the terminal is dlock's again.
func TestRun_TerminalLostLeaseGivesTerminalBack(t *testing.T) {
	store := testservers.StartRedis(t).URL() // Redis: release --force ends another's grant
	term := startTerminal(t, store,
		`"$DLOCK" run --ttl 1s --grace 1s pty:lost -- sh -c '`+ttyState+`; read x; echo "got:$x"'`+after)
	term.wantForegroundCommand(term.await(`^pgrp=(\d+) tpgid=(\d+)`))
	wantCode(t, dlock(t, store, "release", "--force", "pty:lost", "--reason", "pty test"), 0)
	term.await(`^rc=70\r?$`)
	term.wantForegroundBack()
}

// TestRun_TerminalKilledSupervisorOrDlockGivesTerminalBack: when the
// supervisor is killed, dlock gives the terminal back before it exits; when
// dlock is, the supervisor does, to dlock's group (which the shell still
// leads) once the command is gone. dlock is dead before that, so the shell
// waits for the test's word (the file go) before it reads: an interactive
// shell would take the terminal back itself.
func TestRun_TerminalKilledSupervisorOrDlockGivesTerminalBack(t *testing.T) {
	store := dlockdStore(t)
	for _, victim := range []string{"supervisor", "dlock"} {
		t.Run(victim, func(t *testing.T) {
			goFile := filepath.Join(t.TempDir(), "go")
			term := startTerminal(t, store, fmt.Sprintf(
				`"$DLOCK" run --ttl 2s pty:killed-%s -- sh -c '`+ttyState+`; read x; echo "got:$x"'; echo "rc=$?"; `+
					`while [ ! -e %s ]; do sleep 0.05; done; read y; echo "after:$y"`, victim, goFile))
			m := term.await(`^pgrp=(\d+) tpgid=(\d+) ppid=(\d+)`)
			term.wantForegroundCommand(m)
			pid, _ := strconv.Atoi(m[3]) // the supervisor
			if victim == "dlock" {
				pid = parentOf(t, pid)
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			term.await(`^rc=\d+\r?$`)
			deadline := time.Now().Add(5 * time.Second)
			for victim == "dlock" && term.foreground() != term.cmd.Process.Pid && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			term.wantForegroundBack()
		})
	}
}

// TestRun_TerminalCtrlZStopsDlockAndFgResumes: Ctrl-Z stops the command,
// and dlock's group with it, so the job-control shell that runs dlock (sh
// with set -m, as an interactive shell) sees its job stopped; the shell's fg
// continues dlock, which gives the command the terminal again and continues
// it.
func TestRun_TerminalCtrlZStopsDlockAndFgResumes(t *testing.T) {
	term := startTerminal(t, dlockdStore(t),
		`set -m; "$DLOCK" run --ttl 10s pty:stop -- sh -c '`+ttyState+`; read x; echo "got:$x"'; echo "stopped:$?"; `+
			`fg >/dev/null; echo "rc=$?"; read y; echo "after:$y"`)
	term.wantForegroundCommand(term.await(`^pgrp=(\d+) tpgid=(\d+) ppid=(\d+)`))
	term.typeIn("\x1a") // Ctrl-Z
	// 148: the job stopped by SIGTSTP, as the shell reports it.
	term.await(`^(?:\^Z)?stopped:148\r?$`)
	deadline := time.Now().Add(5 * time.Second)
	for term.foreground() == term.cmd.Process.Pid {
		if time.Now().After(deadline) {
			t.Fatal("after fg the command did not get the terminal back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	term.typeIn("hello\n")
	term.await(`^got:hello\r?$`)
	term.await(`^rc=0\r?$`)
	term.wantForegroundBack()
}

// TestRun_TerminalCtrlZWithoutJobControlContinues: when no job-control
// shell runs dlock (its group is orphaned, as when it leads its session, or
// here, when the shell that runs it does no job control and leads the
// session), nothing could continue a stopped dlock: the command is
// continued at once, with a warning, instead of hanging.
func TestRun_TerminalCtrlZWithoutJobControlContinues(t *testing.T) {
	term := startTerminal(t, dlockdStore(t),
		`"$DLOCK" run pty:orphan -- sh -c '`+ttyState+`; read x; echo "got:$x"'`+after)
	term.wantForegroundCommand(term.await(`^pgrp=(\d+) tpgid=(\d+) ppid=(\d+)`))
	term.typeIn("\x1a") // Ctrl-Z
	term.await(`no job-control shell runs dlock`)
	term.typeIn("hello\n")
	term.await(`^got:hello\r?$`)
	term.await(`^rc=0\r?$`)
	term.wantForegroundBack()
}

func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])) // state ppid ...
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

// TestRun_PipedStdinLeavesTerminalAlone: with stdin not a terminal, the
// command does not take the terminal (it runs in the background of it, as
// before) and reads its stdin.
func TestRun_PipedStdinLeavesTerminalAlone(t *testing.T) {
	term := startTerminal(t, dlockdStore(t),
		`echo piped | "$DLOCK" run pty:pipe -- sh -c 'read x; echo "got:$x"; `+ttyState+`'`+after)
	term.await(`^got:piped\r?$`)
	m := term.await(`^pgrp=(\d+) tpgid=(\d+)`)
	if m[1] == m[2] {
		t.Fatalf("with stdin a pipe, the command's group %s took the terminal's foreground", m[1])
	}
	if m[2] != strconv.Itoa(term.cmd.Process.Pid) {
		t.Fatalf("with stdin a pipe, the terminal's foreground was %s while the command ran, want the shell's %d", m[2], term.cmd.Process.Pid)
	}
	term.await(`^rc=0\r?$`)
	term.wantForegroundBack()
}
