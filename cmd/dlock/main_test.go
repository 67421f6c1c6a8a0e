package main_test

// Black-box tests of the dlock binary: built once, run as a subprocess
// against a real redis-server, the way cron and CronJobs run it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server/servertest"
)

// stores are the real stores every CLI test runs against: the default
// (dlockd, the built binary in a subprocess) and Redis.
var stores = []struct {
	name  string
	start func(t *testing.T) string
}{
	{"dlockd", func(t *testing.T) string { return "dlockd://" + servertest.StartProcess(t).Addr() }},
	{"redis", func(t *testing.T) string { return testservers.StartRedis(t).URL() }},
}

// eachStore runs fn as a subtest per store, each with its own fresh server.
func eachStore(t *testing.T, fn func(t *testing.T, store string)) {
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) { fn(t, s.start(t)) })
	}
}

var dlockBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dlock-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dlockBin = filepath.Join(dir, "dlock")
	out, err := exec.Command("go", "build", "-o", dlockBin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building dlock: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	servertest.Cleanup()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

// dlock runs the binary to completion.
func dlock(t *testing.T, store string, args ...string) result {
	t.Helper()
	return runCmd(t, command(store, args...))
}

// runCmd runs cmd to completion and returns its exit code, stdout and
// stderr; a cmd that cannot be run at all ends the test.
func runCmd(t *testing.T, cmd *exec.Cmd) result {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running dlock: %v", err)
	}
	return result{code, out.String(), errb.String()}
}

func command(store string, args ...string) *exec.Cmd {
	cmd := exec.Command(dlockBin, args...)
	cmd.Env = append(os.Environ(), "DLOCK_STORE="+store)
	return cmd
}

func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
}

func TestRun_ExitCodes(t *testing.T) { eachStore(t, testRunExitCodes) }

func testRunExitCodes(t *testing.T, store string) {
	marker := filepath.Join(t.TempDir(), "ran")

	t.Run("command's own code", func(t *testing.T) {
		wantCode(t, dlock(t, store, "run", "codes:own", "--", "sh", "-c", "exit 3"), 3)
	})
	t.Run("killed by a signal is 128+N", func(t *testing.T) {
		wantCode(t, dlock(t, store, "run", "codes:sig", "--", "sh", "-c", "kill -9 $$"), 137)
	})
	t.Run("held key is 75 and the command does not run", func(t *testing.T) {
		holder := command(store, "run", "codes:held", "--", "sleep", "30")
		if err := holder.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = holder.Process.Signal(syscall.SIGTERM); _ = holder.Wait() }()
		waitHeld(t, store, "codes:held")
		res := dlock(t, store, "run", "codes:held", "--", "touch", marker)
		wantCode(t, res, 75)
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the command ran although the key was held")
		}
		res = dlock(t, store, "run", "--wait", "--wait-timeout", "300ms", "codes:held", "--", "touch", marker)
		wantCode(t, res, 75)
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the command ran after --wait-timeout")
		}
		// --wait-timeout 0 makes one attempt, as flock -w 0: 75 at once.
		begun := time.Now()
		res = dlock(t, store, "run", "--wait-timeout", "0s", "codes:held", "--", "touch", marker)
		wantCode(t, res, 75)
		if took := time.Since(begun); took > 20*time.Second {
			t.Fatalf("--wait-timeout 0 took %v: it waited", took)
		}
		// A wait ended by SIGTERM exits 128+15, not 75.
		waiter := command(store, "run", "--wait", "codes:held", "--", "touch", marker)
		if err := waiter.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // let it start waiting
		_ = waiter.Process.Signal(syscall.SIGTERM)
		var ee *exec.ExitError
		if err := waiter.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 143 {
			t.Fatalf("wait interrupted by SIGTERM: %v, want exit 143", err)
		}
	})
	t.Run("unreachable store is 69 and the command does not run", func(t *testing.T) {
		u, _ := url.Parse(store)
		dead := fmt.Sprintf("%s://127.0.0.1:%d", u.Scheme, testservers.FreePort(t))
		wantCode(t, dlock(t, dead, "run", "codes:down", "--", "touch", marker), 69)
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the command ran although the store was unreachable")
		}
		res := dlock(t, dead, "run", "--fail-open", "codes:down", "--", "touch", marker)
		wantCode(t, res, 0)
		if _, err := os.Stat(marker); err != nil {
			t.Fatal("--fail-open did not run the command")
		}
		if !strings.Contains(res.stderr, "WITHOUT a lock") {
			t.Fatalf("--fail-open did not say so on stderr: %q", res.stderr)
		}
	})
	t.Run("a store URL the driver refuses is 64, even with --fail-open", func(t *testing.T) {
		wantCode(t, dlock(t, "redsi://127.0.0.1:1", "run", "--fail-open", "codes:cfg", "--", "touch", marker+"-cfg"), 64)
		if _, err := os.Stat(marker + "-cfg"); err == nil {
			t.Fatal("the command ran without a lock on a misconfigured store")
		}
	})
	t.Run("usage errors are 64", func(t *testing.T) {
		wantCode(t, dlock(t, store, "run", "codes:usage"), 64)
		wantCode(t, dlock(t, store, "run", "--ttl", "10ms", "codes:usage", "--", "true"), 64)
		wantCode(t, dlock(t, store, "run", "", "--", "true"), 64)
		wantCode(t, dlock(t, store, "run", "--grace", "-1s", "codes:usage", "--", "true"), 64)
	})
	t.Run("command that cannot be executed is 126", func(t *testing.T) {
		notExec := filepath.Join(t.TempDir(), "not-executable")
		if err := os.WriteFile(notExec, []byte("#!/bin/sh\ntrue\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		wantCode(t, dlock(t, store, "run", "codes:noexec", "--", notExec), 126)
		wantCode(t, dlock(t, store, "run", "codes:noexec", "--", "true"), 0) // released
	})
	t.Run("missing command is 127", func(t *testing.T) {
		wantCode(t, dlock(t, store, "run", "codes:nf", "--", "/no/such/command"), 127)
		// and the lease was released
		wantCode(t, dlock(t, store, "run", "codes:nf", "--", "true"), 0)
	})
}

func waitHeld(t *testing.T, store, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		res := dlock(t, store, "status", "-o", "json", key)
		var st struct{ Held bool }
		if res.code == 0 && json.Unmarshal([]byte(res.stdout), &st) == nil && st.Held {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never became held", key)
}

func TestRun_EnvironmentAndJSON(t *testing.T) { eachStore(t, testRunEnvironmentAndJSON) }

func testRunEnvironmentAndJSON(t *testing.T, store string) {
	res := dlock(t, store, "run", "-o", "json", "env:key", "--", "sh", "-c", `echo "$DLOCK_KEY|$DLOCK_FENCE|$DLOCK_STORE"`)
	wantCode(t, res, 0)
	parts := strings.Split(strings.TrimSpace(res.stdout), "|")
	if len(parts) != 3 || parts[0] != "env:key" || parts[2] != store {
		t.Fatalf("environment %q", res.stdout)
	}
	fence, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || fence == 0 {
		t.Fatalf("DLOCK_FENCE %q", parts[1])
	}
	var rep struct {
		Result   string
		Fence    uint64
		ExitCode int `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(res.stderr), &rep); err != nil {
		t.Fatalf("--output json stderr %q: %v", res.stderr, err)
	}
	if rep.Result != "ran" || rep.Fence != fence || rep.ExitCode != 0 {
		t.Fatalf("json report %+v", rep)
	}
}

// TestRun_LostLeaseTerminatesCommand: dlock is stopped (SIGSTOP) for longer
// than the TTL; meanwhile a second dlock run --wait gets the key with a
// greater fence; when the first resumes it must terminate its command within
// a second and exit 70.
func TestRun_LostLeaseTerminatesCommand(t *testing.T) { eachStore(t, testRunLostLease) }

func testRunLostLease(t *testing.T, store string) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	first := command(store, "run", "--ttl", "500ms", "--grace", "5s", "lost:key", "--",
		"sh", "-c", `echo $$ > `+pidFile+`; echo fence=$DLOCK_FENCE; exec sleep 60`)
	var out1, err1 bytes.Buffer
	first.Stdout, first.Stderr = &out1, &err1
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	childPID := readPID(t, pidFile)

	if err := first.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	second := dlock(t, store, "run", "--wait", "--wait-timeout", "10s", "lost:key", "--", "sh", "-c", "echo fence=$DLOCK_FENCE")
	wantCode(t, second, 0)
	time.Sleep(100 * time.Millisecond) // stay stopped a little longer
	resumed := time.Now()
	if err := first.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The command must be gone within a second of the resume.
	for processAlive(childPID) {
		if time.Since(resumed) > time.Second {
			t.Fatalf("command (pid %d) still running %v after dlock resumed", childPID, time.Since(resumed))
		}
		time.Sleep(10 * time.Millisecond)
	}
	err := first.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 70 {
		t.Fatalf("first dlock: %v, want exit 70\nstderr: %s", err, err1.String())
	}
	f1 := fenceOf(t, out1.String())
	f2 := fenceOf(t, second.stdout)
	if f2 <= f1 {
		t.Fatalf("second holder's fence %d is not greater than the lost holder's %d", f2, f1)
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(path)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func fenceOf(t *testing.T, out string) uint64 {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "fence="); ok {
			f, err := strconv.ParseUint(v, 10, 64)
			if err == nil {
				return f
			}
		}
	}
	t.Fatalf("no fence= line in %q", out)
	return 0
}

func TestRun_SignalsForwardedAndNoOrphans(t *testing.T) { eachStore(t, testRunSignals) }

func testRunSignals(t *testing.T, store string) {
	dir := t.TempDir()
	got := filepath.Join(dir, "got")
	grandchild := filepath.Join(dir, "grandchild.pid")
	// The command starts a background grandchild, then waits for SIGTERM.
	script := fmt.Sprintf(`sleep 60 & echo $! > %s; trap 'echo TERM > %s; exit 0' TERM; while :; do sleep 0.05; done`, grandchild, got)
	cmd := command(store, "run", "sig:key", "--", "sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	gpid := readPID(t, grandchild)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dlock after a forwarded SIGTERM: %v, want the command's exit 0", err)
	}
	if b, _ := os.ReadFile(got); strings.TrimSpace(string(b)) != "TERM" {
		t.Fatalf("the command did not receive SIGTERM (file: %q)", b)
	}
	deadline := time.Now().Add(2 * time.Second)
	for processAlive(gpid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(gpid, syscall.SIGKILL)
			t.Fatalf("grandchild %d outlived dlock", gpid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The lease was released: the key is free.
	wantCode(t, dlock(t, store, "run", "sig:key", "--", "true"), 0)
}

func TestInspection_StatusListFenceCheck(t *testing.T) { eachStore(t, testInspection) }

func testInspection(t *testing.T, store string) {
	res := dlock(t, store, "status", "insp:key")
	wantCode(t, res, 0)
	if !strings.Contains(res.stdout, "free") {
		t.Fatalf("status of a free key: %q", res.stdout)
	}
	// Inside a run, the command inspects its own lease.
	script := `dlock status -o json insp:key; echo ---; dlock list -o json insp:; echo ---; dlock fence check insp:key $DLOCK_FENCE; echo "rc=$?"; dlock fence check insp:key 999999; echo "rc=$?"`
	cmd := command(store, "run", "--holder", "test-holder", "insp:key", "--", "sh", "-c", script)
	cmd.Env = append(cmd.Env, "PATH="+filepath.Dir(dlockBin)+":"+os.Getenv("PATH"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	parts := strings.Split(string(out), "---\n")
	if len(parts) != 3 {
		t.Fatalf("output %q", out)
	}
	var st struct {
		Key, Holder string
		Held        bool
		Fence       uint64
		Left        float64 `json:"left_seconds"`
	}
	if err := json.Unmarshal([]byte(parts[0]), &st); err != nil || !st.Held || st.Holder != "test-holder" || st.Fence == 0 || st.Left <= 0 {
		t.Fatalf("status json %q (%v)", parts[0], err)
	}
	var list []struct{ Key string }
	if err := json.Unmarshal([]byte(parts[1]), &list); err != nil || len(list) != 1 || list[0].Key != "insp:key" {
		t.Fatalf("list json %q (%v)", parts[1], err)
	}
	if !strings.Contains(parts[2], "current\nrc=0") || !strings.Contains(parts[2], "not current") || !strings.Contains(parts[2], "rc=1") {
		t.Fatalf("fence check output %q", parts[2])
	}
}

func TestHelp_EveryCommandHasExamples(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {"status", "--help"}, {"list", "--help"}, {"release", "--help"}, {"fence", "--help"}, {"fence", "check", "--help"}, {"version", "--help"}, {"bench", "--help"}} {
		res := dlock(t, "mem://", args...)
		wantCode(t, res, 0)
		if !strings.Contains(res.stdout, "Example") && !strings.Contains(res.stdout, "Examples") {
			t.Errorf("dlock %v: no examples in help:\n%s", args, res.stdout)
		}
	}
}

func TestRelease_ForceRemovesDeadHoldersGrant(t *testing.T) {
	r := testservers.StartRedis(t)
	store := r.URL()
	wantCode(t, dlock(t, store, "release", "force:key", "--reason", "x"), 64)           // --force missing
	wantCode(t, dlock(t, store, "release", "--force", "force:key"), 64)                 // --reason missing
	wantCode(t, dlock(t, store, "release", "--force", "force:key", "--reason", "x"), 1) // not held

	// A holder that died without releasing (SIGKILL) leaves a grant with a long TTL.
	holder := command(store, "run", "--ttl", "1h", "force:key", "--", "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, store, "force:key")
	_ = holder.Process.Kill()
	_ = holder.Wait()
	wantCode(t, dlock(t, store, "run", "force:key", "--", "true"), 75)

	res := dlock(t, store, "release", "--force", "force:key", "--reason", "holder pod evicted")
	wantCode(t, res, 0)
	if !strings.Contains(res.stdout, "released force:key") || !strings.Contains(res.stderr, "holder pod evicted") {
		t.Fatalf("stdout %q stderr %q: want the release reported and the reason logged", res.stdout, res.stderr)
	}
	wantCode(t, dlock(t, store, "run", "force:key", "--", "true"), 0)
}

// TestRun_KilledDlockTakesItsCommandAlong: when dlock itself is killed
// (SIGKILL, OOM), its command must not run on without a lease.
func TestRun_KilledDlockTakesItsCommandAlong(t *testing.T) {
	r := testservers.StartRedis(t)
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	cmd := command(r.URL(), "run", "--ttl", "2s", "killed:key", "--", "sh", "-c", "echo $$ > "+pidFile+"; exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child := readPID(t, pidFile)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(2 * time.Second)
	for processAlive(child) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("command %d still running after dlock was killed", child)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRelease_ForceUnsupportedIs78: on a store without force release
// (Redlock, which cannot inspect either), release --force and status exit
// 78 with a message that says so, and the holder's grant stays.
func TestRelease_ForceUnsupportedIs78(t *testing.T) {
	rs := testservers.StartRedisN(t, 3)
	store := "redlock://" + rs[0].Addr() + "," + rs[1].Addr() + "," + rs[2].Addr()
	running := filepath.Join(t.TempDir(), "running")
	holder := command(store, "run", "--ttl", "1h", "unsup:key", "--", "sh", "-c", "touch "+running+"; exec sleep 60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Process.Signal(syscall.SIGTERM); _ = holder.Wait() }()
	awaitFile(t, running)

	res := dlock(t, store, "release", "--force", "unsup:key", "--reason", "holder pod evicted")
	wantCode(t, res, 78)
	if !strings.Contains(res.stderr, "unsupported operation") || !strings.Contains(res.stderr, "no force release") {
		t.Fatalf("stderr %q: want it to say the store has no force release", res.stderr)
	}
	res = dlock(t, store, "status", "unsup:key")
	wantCode(t, res, 78)
	if !strings.Contains(res.stderr, "unsupported operation") {
		t.Fatalf("status stderr %q: want it to say the store cannot inspect", res.stderr)
	}
	// Nothing was removed: the key is still held.
	wantCode(t, dlock(t, store, "run", "unsup:key", "--", "true"), 75)
	// Usage errors stay 64, checked before the store is asked.
	wantCode(t, dlock(t, store, "release", "--force", "unsup:key"), 64)
}

// TestRelease_ForceOnDlockdEndsHolderAndGrantsWaiter: on dlockd, release
// --force removes a live holder's grant; the holder's dlock run hears of
// the loss by push and exits 70 at once (its TTL is an hour), and a queued
// dlock run --wait is granted with a greater fence.
func TestRelease_ForceOnDlockdEndsHolderAndGrantsWaiter(t *testing.T) {
	start := time.Now()
	store := "dlockd://" + servertest.StartProcess(t).Addr()
	t.Logf("dlockd ready after %v", time.Since(start))
	dir := t.TempDir()
	running := filepath.Join(dir, "running")
	holder := command(store, "run", "--ttl", "1h", "--grace", "5s", "force:live", "--",
		"sh", "-c", "echo fence=$DLOCK_FENCE; touch "+running+"; exec sleep 60")
	var hout, herr bytes.Buffer
	holder.Stdout, holder.Stderr = &hout, &herr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	holderDone := make(chan error, 1)
	go func() { holderDone <- holder.Wait() }()
	defer func() {
		_ = holder.Process.Signal(syscall.SIGTERM)
		<-holderDone
	}()
	awaitFile(t, running)

	waiter := command(store, "run", "--wait", "--wait-timeout", "30s", "force:live", "--", "sh", "-c", "echo fence=$DLOCK_FENCE")
	var wout, werr bytes.Buffer
	waiter.Stdout, waiter.Stderr = &wout, &werr
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	waiterDone := make(chan error, 1)
	go func() { waiterDone <- waiter.Wait() }()
	defer func() {
		_ = waiter.Process.Signal(syscall.SIGTERM)
		<-waiterDone
	}()
	awaitWaiters(t, store, "force:live", 1)
	t.Logf("holder running and waiter queued after %v", time.Since(start))

	released := time.Now()
	res := dlock(t, store, "release", "--force", "force:live", "--reason", "operator test")
	wantCode(t, res, 0)
	if !strings.Contains(res.stdout, "released force:live") {
		t.Fatalf("release stdout %q", res.stdout)
	}
	select {
	case err := <-holderDone:
		holderDone <- err // for the deferred cleanup
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 70 {
			t.Fatalf("holder: %v, want exit 70\nstderr: %s", err, herr.String())
		}
		since := time.Since(released)
		t.Logf("holder exited 70 %v after the force release", since)
		if since > 3*time.Second {
			t.Fatalf("holder exited %v after the force release, want at once", since)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("holder still running 10s after the force release (TTL 1h)\nstderr: %s", herr.String())
	}
	select {
	case err := <-waiterDone:
		waiterDone <- err
		if err != nil {
			t.Fatalf("waiter: %v\nstderr: %s", err, werr.String())
		}
		t.Logf("waiter ran %v after the force release", time.Since(released))
	case <-time.After(30 * time.Second):
		t.Fatalf("waiter not granted 30s after the force release\nstderr: %s", werr.String())
	}
	if f1, f2 := fenceOf(t, hout.String()), fenceOf(t, wout.String()); f2 <= f1 {
		t.Fatalf("waiter's fence %d is not greater than the removed holder's %d", f2, f1)
	}
}

func awaitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
}

// awaitWaiters waits until dlock status reports n queued waiters on key.
func awaitWaiters(t *testing.T, store, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		res := dlock(t, store, "status", "-o", "json", key)
		var st struct{ Waiters *int }
		if res.code == 0 && json.Unmarshal([]byte(res.stdout), &st) == nil && st.Waiters != nil && *st.Waiters == n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never had %d waiters", key, n)
}
