package main_test

// Black-box tests of dlock run's supervisor: nothing the command starts (its
// background children, daemons it double-forks into another session) may
// run on once dlock is gone or its lease is lost, so no second holder ever
// runs beside it. Every test records the PIDs the command writes and kills
// whatever of them is left at cleanup.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// superviseModes are the two ways the supervisor contains a command: a
// cgroup v2 of its own where the hierarchy is writable (as on the test
// machine; elsewhere "auto" falls back and says so with --debug), and the
// process group and subreaper alone.
var superviseModes = []struct {
	name  string
	flags []string
}{
	{"auto", nil},
	{"cgroup-off", []string{"--cgroup", "off"}},
}

// eachSuperviseMode runs fn per store and mode; one server per store.
func eachSuperviseMode(t *testing.T, fn func(t *testing.T, store, mode string, flags []string)) {
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			store := s.start(t)
			for _, m := range superviseModes {
				t.Run(m.name, func(t *testing.T) { fn(t, store, m.name, m.flags) })
			}
		})
	}
}

// superviseJob is a command with foreground work, a background child in its
// process group, and a daemon double-forked into a session of its own
// (re-parented away from the command at once). Each of its four processes
// appends its PID to pids; done is written only if the foreground work
// finishes.
func superviseJob(pids, done string) string {
	return fmt.Sprintf(`echo $$ >> '%[1]s'
sleep 30 & echo $! >> '%[1]s'
(setsid sh -c 'echo $$ >> "%[1]s"; exec sleep 30' &)
sh -c 'echo $$ >> "%[1]s"; exec sleep 30'
echo done > '%[2]s'`, pids, done)
}

// superviseCheck is the command of the next holder: it exits 1, naming
// them, if any process in pids is alive (zombies are not).
func superviseCheck(pids string) string {
	return fmt.Sprintf(`alive=0
for p in $(cat '%s'); do
  [ -r /proc/$p/stat ] || continue
  state=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f1)
  [ "$state" = Z ] || { echo "alive when the next holder started: $p"; alive=1; }
done
exit $alive`, pids)
}

// superviseAwaitPIDs waits until path holds n PIDs and returns them.
func superviseAwaitPIDs(t *testing.T, path string, n int) []int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		var pids []int
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		if len(pids) >= n {
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d PIDs after 10s, want %d", path, len(pids), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// superviseChildren lists the live children of pid, from /proc.
func superviseChildren(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, c)
		}
	}
	return out
}

// superviseKillAtCleanup SIGKILLs, at the end of the test, whatever of pids
// is still alive, so that a failing test leaks nothing.
func superviseKillAtCleanup(t *testing.T, pids func() []int) {
	t.Cleanup(func() {
		for _, pid := range pids() {
			if processAlive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// superviseAwaitGone fails unless every process in pids is gone within
// limit of since; it names the survivors.
func superviseAwaitGone(t *testing.T, pids []int, since time.Time, limit time.Duration, what string) {
	t.Helper()
	for {
		var alive []int
		for _, pid := range pids {
			if processAlive(pid) {
				alive = append(alive, pid)
			}
		}
		if len(alive) == 0 {
			return
		}
		if time.Since(since) > limit {
			t.Fatalf("processes %v of the command still alive %v after %s", alive, time.Since(since).Round(time.Millisecond), what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startDlock starts dlock in the background; it is SIGKILLed at cleanup if
// the test ends first. Its output goes to files, not pipes: waiting for it
// must not wait for whatever else holds its stdout (a leaked background
// process would). wait returns its exit; out reads a stream ("stdout" or
// "stderr") after it.
func startDlock(t *testing.T, store string, args ...string) (cmd *exec.Cmd, out func(stream string) string, wait func() error) {
	t.Helper()
	dir := t.TempDir()
	cmd = command(store, args...)
	stdout, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stdout.Close()
	stderr.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waited := false
	wait = func() error {
		if !waited {
			err, waited = <-done, true
		}
		return err
	}
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = wait()
		}
	})
	out = func(stream string) string {
		b, _ := os.ReadFile(filepath.Join(dir, stream))
		return string(b)
	}
	return cmd, out, wait
}

// TestRun_SuperviseKilledDlockLeavesNothing: dlock run is SIGKILLed while
// its command runs foreground work, a background child and a double-forked
// daemon. Within about a second none of them is alive (nor the
// supervisor), and a second dlock run --wait, which gets the key after the
// TTL, finds none of them alive when its command starts.
func TestRun_SuperviseKilledDlockLeavesNothing(t *testing.T) {
	eachSuperviseMode(t, testSuperviseKilledDlock)
}

func testSuperviseKilledDlock(t *testing.T, store, mode string, flags []string) {
	dir := t.TempDir()
	pidFile, done := filepath.Join(dir, "pids"), filepath.Join(dir, "done")
	key := "sup:killed:" + mode
	var tracked []int
	superviseKillAtCleanup(t, func() []int { return tracked })

	args := append(append([]string{"run"}, flags...), "--ttl", "3s", "--grace", "5s", key, "--", "sh", "-c", superviseJob(pidFile, done))
	first, _, wait := startDlock(t, store, args...)
	tracked = superviseAwaitPIDs(t, pidFile, 4)
	tracked = append(tracked, superviseChildren(first.Process.Pid)...) // the supervisor (the command's sh before)

	_ = first.Process.Kill()
	killed := time.Now()
	_ = wait()
	// The next holder starts as soon as the key is free (after the TTL).
	_, nextOut, nextWait := startDlock(t, store, "run", "--wait", "--wait-timeout", "20s", key, "--", "sh", "-c", superviseCheck(pidFile))

	superviseAwaitGone(t, tracked, killed, time.Second, "dlock was SIGKILLed")
	if err := nextWait(); err != nil {
		t.Fatalf("next holder: %v\nstdout: %s\nstderr: %s", err, nextOut("stdout"), nextOut("stderr"))
	}
	if _, err := os.Stat(done); err == nil {
		t.Fatal("the command's foreground work finished after dlock was killed")
	}
}

// TestRun_SuperviseLostLeaseKillsBackgroundWork: dlock is stopped (SIGSTOP)
// past its TTL while its command runs background and daemonized work. The
// supervisor, seeing the validity deadline pass with no renewal, terminates
// all of it before the next holder's command starts; once dlock resumes, it
// exits 70.
func TestRun_SuperviseLostLeaseKillsBackgroundWork(t *testing.T) {
	eachSuperviseMode(t, testSuperviseLostLease)
}

func testSuperviseLostLease(t *testing.T, store, mode string, flags []string) {
	dir := t.TempDir()
	pidFile, done := filepath.Join(dir, "pids"), filepath.Join(dir, "done")
	key := "sup:lost:" + mode
	var tracked []int
	superviseKillAtCleanup(t, func() []int { return tracked })

	args := append(append([]string{"run"}, flags...), "--ttl", "1s", "--grace", "5s", key, "--", "sh", "-c", superviseJob(pidFile, done))
	first, firstOut, wait := startDlock(t, store, args...)
	tracked = superviseAwaitPIDs(t, pidFile, 4)
	tracked = append(tracked, superviseChildren(first.Process.Pid)...)

	if err := first.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	next := dlock(t, store, "run", "--wait", "--wait-timeout", "20s", key, "--", "sh", "-c", superviseCheck(pidFile))
	resumed := time.Now()
	if err := first.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wantCode(t, next, 0)
	superviseAwaitGone(t, tracked, resumed, time.Second, "dlock resumed")
	var ee *exec.ExitError
	if err := wait(); !errors.As(err, &ee) || ee.ExitCode() != 70 {
		t.Fatalf("first dlock: %v, want exit 70\nstderr: %s", err, firstOut("stderr"))
	}
}

// TestRun_SuperviseForceReleaseKillsBackgroundWork: a lease lost while dlock
// runs normally (release --force) ends the daemonized work too, before
// dlock exits 70.
func TestRun_SuperviseForceReleaseKillsBackgroundWork(t *testing.T) {
	eachSuperviseMode(t, testSuperviseForceRelease)
}

func testSuperviseForceRelease(t *testing.T, store, mode string, flags []string) {
	dir := t.TempDir()
	pidFile, done := filepath.Join(dir, "pids"), filepath.Join(dir, "done")
	key := "sup:force:" + mode
	var tracked []int
	superviseKillAtCleanup(t, func() []int { return tracked })

	args := append(append([]string{"run"}, flags...), "--ttl", "3s", "--grace", "5s", key, "--", "sh", "-c", superviseJob(pidFile, done))
	first, firstOut, wait := startDlock(t, store, args...)
	tracked = superviseAwaitPIDs(t, pidFile, 4)
	tracked = append(tracked, superviseChildren(first.Process.Pid)...)

	res := dlock(t, store, "release", "--force", key, "--reason", "supervise test")
	if res.code == 78 {
		t.Skipf("this store has no force release: %s", res.stderr)
	}
	wantCode(t, res, 0)
	var ee *exec.ExitError
	if err := wait(); !errors.As(err, &ee) || ee.ExitCode() != 70 {
		t.Fatalf("dlock: %v, want exit 70\nstderr: %s", err, firstOut("stderr"))
	}
	// dlock exits only once the supervisor has reaped everything.
	superviseAwaitGone(t, tracked, time.Now(), 0, "dlock exited 70")
}

// TestRun_SuperviseDaemonKilledWhenCommandEnds: a command that exits 0 after
// double-forking a daemon leaves nothing running: the daemon is killed
// before dlock exits and releases the key.
func TestRun_SuperviseDaemonKilledWhenCommandEnds(t *testing.T) {
	eachSuperviseMode(t, func(t *testing.T, store, mode string, flags []string) {
		pidFile := filepath.Join(t.TempDir(), "daemon.pid")
		var tracked []int
		superviseKillAtCleanup(t, func() []int { return tracked })
		script := fmt.Sprintf(`(setsid sh -c 'echo $$ > "%s"; exec sleep 30' </dev/null >/dev/null 2>&1 &); while [ ! -s '%s' ]; do sleep 0.01; done`, pidFile, pidFile)
		res := dlock(t, store, append(append([]string{"run"}, flags...), "sup:daemon:"+mode, "--", "sh", "-c", script)...)
		tracked = []int{readPID(t, pidFile)}
		wantCode(t, res, 0)
		superviseAwaitGone(t, tracked, time.Now(), 0, "dlock exited")
	})
}

// TestRun_SuperviseExitCodesWithoutCgroup: with the process group and
// subreaper alone, the exit codes are those of TestRun_ExitCodes (which
// covers the default mode).
func TestRun_SuperviseExitCodesWithoutCgroup(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		notExec := filepath.Join(t.TempDir(), "not-executable")
		if err := os.WriteFile(notExec, []byte("#!/bin/sh\ntrue\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			argv []string
			code int
		}{
			{[]string{"sh", "-c", "exit 3"}, 3},
			{[]string{"sh", "-c", "kill -9 $$"}, 137},
			{[]string{notExec}, 126},
			{[]string{"/no/such/command"}, 127},
			{[]string{"no-such-command-in-path"}, 127},
			{[]string{"true"}, 0},
		} {
			args := append([]string{"run", "--cgroup", "off", "codes:nocg", "--"}, tc.argv...)
			wantCode(t, dlock(t, store, args...), tc.code)
		}
	})
}

// TestRun_SuperviseModeSaidAndCgroupRemoved: --debug says how the command
// was contained; a cgroup made for a run is gone when dlock exits.
func TestRun_SuperviseModeSaidAndCgroupRemoved(t *testing.T) {
	store := "mem://"
	res := dlock(t, store, "run", "--debug", "mode:key", "--", "true")
	wantCode(t, res, 0)
	if m := regexp.MustCompile(`cgroup v2 (\S+) \(killed by`).FindStringSubmatch(res.stderr); m != nil {
		if _, err := os.Stat(m[1]); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("cgroup %s still there after dlock exited (%v)", m[1], err)
		}
	} else if strings.Contains(res.stderr, "no cgroup (") {
		t.Logf("no cgroup on this machine: %s", res.stderr)
	} else {
		t.Fatalf("--debug did not say how the command was contained: %q", res.stderr)
	}
	res = dlock(t, store, "run", "--debug", "--cgroup", "off", "mode:key", "--", "true")
	wantCode(t, res, 0)
	if !strings.Contains(res.stderr, "no cgroup (--cgroup off)") || !strings.Contains(res.stderr, "subreaper") {
		t.Fatalf("--cgroup off --debug: %q", res.stderr)
	}
	wantCode(t, dlock(t, store, "run", "--cgroup", "maybe", "mode:key", "--", "true"), 64)
}

// TestRun_SuperviseCtrlCFromTerminal: dlock started in the foreground of a
// terminal (a pty) hands the foreground to the command's group, so Ctrl-C
// from the line discipline reaches the command directly (not forwarded by
// dlock), and the command exits on its own terms.
func TestRun_SuperviseCtrlCFromTerminal(t *testing.T) {
	master, slave := openPTY(t)
	dir := t.TempDir()
	ready, got := filepath.Join(dir, "ready"), filepath.Join(dir, "got")
	script := fmt.Sprintf(`trap 'echo INT > "%s"; exit 0' INT; touch '%s'; while :; do sleep 0.05; done`, got, ready)
	cmd := command("mem://", "run", "tty:key", "--", "sh", "-c", script)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	go func() { _, _ = bytes.NewBuffer(nil).ReadFrom(master) }() // drain the terminal
	superviseAwaitFile(t, ready)
	if _, err := master.Write([]byte{3}); err != nil { // ^C
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dlock after Ctrl-C: %v, want the command's exit 0", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("dlock still running 10s after Ctrl-C")
	}
	if b, _ := os.ReadFile(got); strings.TrimSpace(string(b)) != "INT" {
		t.Fatalf("the command did not get SIGINT (file: %q)", b)
	}
}

// openPTY opens a pseudo-terminal pair; both ends are closed at cleanup.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatalf("unlocking the pty: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatalf("pty number: %v", e)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slave.Close() })
	return master, slave
}

// superviseAwaitFile waits until path exists.
func superviseAwaitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
