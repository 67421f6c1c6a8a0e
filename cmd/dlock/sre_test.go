package main_test

// Black-box tests of issue 13, tried as an SRE replacing consul lock,
// etcdctl lock, flock(1) and Redis locks in cron jobs would: invalid input
// never fails open, waits and retries survive a store restart, flock and
// consul parity flags, configuration without flags, errors that say what
// to do, and -o json for errors.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server/servertest"
)

// startHolder starts dlock run holding key with a command that sleeps, and
// waits until the key is held. The holder is stopped at cleanup.
func startHolder(t *testing.T, store, key string, flags ...string) *exec.Cmd {
	t.Helper()
	args := append(append([]string{"run"}, flags...), key, "--", "sleep", "60")
	cmd := command(store, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	waitHeld(t, store, key)
	return cmd
}

func mustNotExist(t *testing.T, path, what string) {
	t.Helper()
	if _, err := os.Stat(path); err == nil {
		t.Fatalf("%s: the command ran", what)
	}
}

// Item 1: input refused as invalid exits 64 and never fails open, even with
// the key held (so a "degraded" lease would run the job without a lock).
func TestRun_InvalidInputNeverFailsOpen(t *testing.T) { eachStore(t, testInvalidInputNeverFailsOpen) }

func testInvalidInputNeverFailsOpen(t *testing.T, store string) {
	marker := filepath.Join(t.TempDir(), "ran")
	startHolder(t, store, "inv:key")
	for _, tc := range []struct {
		name  string
		store string
		args  []string
	}{
		{"holder of 5000 bytes", store, []string{"--holder", strings.Repeat("x", 5000)}},
		{"holder of 257 bytes", store, []string{"--holder", strings.Repeat("h", 257)}},
		{"holder with a newline", store, []string{"--holder", "host-3\npid 1"}},
		{"ttl out of range", store, []string{"--ttl", "48h"}},
		{"port 99999", "dlockd://127.0.0.1:99999", nil},
		{"store without scheme", "127.0.0.1:7450", nil},
		{"unknown scheme", "http://127.0.0.1:7450", nil},
		{"negative retry-for", store, []string{"--retry-for", "-1s"}},
		{"URL parameter the driver refuses", store + "?bogus=1", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"run", "--fail-open"}, tc.args...), "inv:key", "--", "touch", marker)
			res := dlock(t, tc.store, args...)
			wantCode(t, res, 64)
			mustNotExist(t, marker, tc.name)
			if strings.Contains(res.stderr, "WITHOUT a lock") {
				t.Fatalf("invalid input ran without a lock: %s", res.stderr)
			}
		})
	}
}

// Item 2: a waiting dlock run survives a dlockd restart (SHUTTING_DOWN, then
// NOT_LEADER during the election at start) and runs once the holder is gone.
func TestRun_WaitSurvivesDlockdRestart(t *testing.T) {
	p := servertest.StartProcess(t)
	store := "dlockd://" + p.Addr()
	holder := command(store, "run", "--ttl", "3s", "restart:key", "--", "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	holderDone := make(chan error, 1)
	go func() { holderDone <- holder.Wait() }()
	defer func() { _ = holder.Process.Kill(); <-holderDone }()
	waitHeld(t, store, "restart:key")

	waiter := command(store, "run", "--wait", "--wait-timeout", "60s", "restart:key", "--", "echo", "ran")
	var wout, werr bytes.Buffer
	waiter.Stdout, waiter.Stderr = &wout, &werr
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	waiterDone := make(chan error, 1)
	go func() { waiterDone <- waiter.Wait() }()
	defer func() { _ = waiter.Process.Kill() }()
	awaitWaiters(t, store, "restart:key", 1)

	if err := p.Stop(); err != nil { // graceful: the waiter's stream gets SHUTTING_DOWN
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-waiterDone:
		t.Fatalf("the waiter ended while dlockd was down: %v\nstderr: %s", err, werr.String())
	default:
	}
	if err := p.Start(); err != nil { // same data dir and port; a leader election first
		t.Fatal(err)
	}
	// The holder goes away; its grant is released or expires (TTL 3s).
	_ = holder.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-waiterDone:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("waiter exited %d across the restart, want 0\nstderr: %s", ee.ExitCode(), werr.String())
		}
		if err != nil || strings.TrimSpace(wout.String()) != "ran" {
			t.Fatalf("waiter: %v, stdout %q", err, wout.String())
		}
	case <-time.After(45 * time.Second):
		t.Fatalf("waiter not granted 45s after the restart\nstderr: %s", werr.String())
	}
}

// Item 2: dlock run started while the store is down runs once the store
// comes up within --retry-for; with --retry-for 0 it exits 69 at once.
func TestRun_RetriesStoreThatComesUp(t *testing.T) {
	t.Run("dlockd", func(t *testing.T) {
		p := servertest.StartProcess(t)
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
		store := "dlockd://" + p.Addr()
		start := time.Now()
		res := dlock(t, store, "run", "--retry-for", "0", "down:key", "--", "true")
		wantCode(t, res, 69)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("--retry-for 0 took %v", d)
		}
		// dlockd's start (and election) is slow on a loaded machine: give
		// it 30s here; Redis below shows the default 5s.
		testComesUp(t, store, []string{"--retry-for", "30s"}, p.Start)
	})
	t.Run("redis default retry-for", func(t *testing.T) {
		r := testservers.StartRedis(t)
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		testComesUp(t, r.URL(), nil, r.Start)
	})
}

func testComesUp(t *testing.T, store string, flags []string, start func() error) {
	args := append(append([]string{"run"}, flags...), "down:key", "--", "echo", "ran")
	cmd := command(store, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()
	time.Sleep(time.Second)
	if err := start(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || strings.TrimSpace(out.String()) != "ran" {
			t.Fatalf("run started while the store was down: %v, stdout %q\nstderr: %s", err, out.String(), errb.String())
		}
		// It said once that it was retrying, and why.
		if n := strings.Count(errb.String(), "retrying for up to"); n != 1 || !strings.Contains(errb.String(), "connection refused") {
			t.Fatalf("stderr %q: want one line saying it retries the unreachable store", errb.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("run still going 60s after the store came up\nstderr: %s", errb.String())
	}
}

// Item 3: --wait-timeout without --wait waits (as flock -w).
func TestRun_WaitTimeoutImpliesWait(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	marker := filepath.Join(t.TempDir(), "ran")
	holder := startHolder(t, store, "wt:key")
	start := time.Now()
	res := dlock(t, store, "run", "--wait-timeout", "700ms", "wt:key", "--", "touch", marker)
	wantCode(t, res, 75)
	if d := time.Since(start); d < 600*time.Millisecond {
		t.Fatalf("--wait-timeout 700ms gave up after %v: it did not wait", d)
	}
	mustNotExist(t, marker, "after --wait-timeout")
	if !strings.Contains(res.stderr, "--wait-timeout") {
		t.Fatalf("stderr %q: want it to say the wait timed out", res.stderr)
	}
	go func() { time.Sleep(500 * time.Millisecond); _ = holder.Process.Signal(syscall.SIGTERM) }()
	res = dlock(t, store, "run", "--wait-timeout", "30s", "wt:key", "--", "touch", marker)
	wantCode(t, res, 0)
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("--wait-timeout 30s did not run the command once the key was free")
	}
}

// Item 4: a release that fails when the job ends (store down) warns with the
// key, the fence and how long the key stays held, reports it in JSON, and
// keeps the job's exit code.
func TestRun_ReleaseFailureWarns(t *testing.T) {
	type server struct {
		url, addr string
		kill      func()
	}
	starts := map[string]func(t *testing.T) server{
		"redis": func(t *testing.T) server {
			r := testservers.StartRedis(t)
			return server{r.URL(), r.Addr(), r.Kill}
		},
		"dlockd": func(t *testing.T) server {
			p := servertest.StartProcess(t)
			return server{"dlockd://" + p.Addr(), p.Addr(), func() { _ = p.Kill() }}
		},
	}
	for _, tc := range []struct {
		store   string
		jobCode int
	}{{"redis", 0}, {"redis", 3}, {"dlockd", 0}} {
		jobCode := tc.jobCode
		t.Run(fmt.Sprintf("%s job exits %d", tc.store, jobCode), func(t *testing.T) {
			r := starts[tc.store](t)
			dir := t.TempDir()
			running, goOn, rep := filepath.Join(dir, "running"), filepath.Join(dir, "go"), filepath.Join(dir, "report.json")
			script := fmt.Sprintf(`echo fence=$DLOCK_FENCE; touch %s; while [ ! -f %s ]; do sleep 0.02; done; exit %d`, running, goOn, jobCode)
			cmd := command(r.url, "run", "--ttl", "30s", "--report", rep, "rel:key", "--", "sh", "-c", script)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill() }()
			awaitFile(t, running)
			r.kill()
			if err := os.WriteFile(goOn, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			if code != jobCode {
				t.Fatalf("dlock exited %d (%v), want the job's %d\nstderr: %s", code, err, jobCode, errb.String())
			}
			fence := fenceOf(t, out.String())
			stderr := errb.String()
			for _, want := range []string{"could not release", `"rel:key"`, fmt.Sprintf("fence %d", fence), "stays held", r.addr} {
				if !strings.Contains(stderr, want) {
					t.Fatalf("stderr %q: want %q", stderr, want)
				}
			}
			if !strings.Contains(stderr, "at most its TTL (30s) after the store is reachable again") {
				t.Fatalf("stderr %q: want how long the key stays held (at most its TTL after the store is back)", stderr)
			}
			var report struct {
				ExitCode       int     `json:"exit_code"`
				Fence          uint64  `json:"fence"`
				ReleaseError   string  `json:"release_error"`
				HeldForSeconds float64 `json:"key_held_up_to_seconds"`
			}
			b, _ := os.ReadFile(rep)
			if err := json.Unmarshal(b, &report); err != nil {
				t.Fatalf("report %q: %v", b, err)
			}
			if report.ExitCode != jobCode || report.Fence != fence || report.ReleaseError == "" || report.HeldForSeconds <= 0 || report.HeldForSeconds > 30 {
				t.Fatalf("report %s: want exit_code %d, fence %d, release_error, held_for_seconds in (0, 30]", b, jobCode, fence)
			}
		})
	}
}

// Item 7: --permits N lets N holders run at once on distinct slots (their
// fences and indexes in DLOCK_FENCE and DLOCK_PERMIT); the next one is held.
func TestRun_Permits(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	dir := t.TempDir()
	var holders []*exec.Cmd
	var files []string
	for i := range 2 {
		f := filepath.Join(dir, fmt.Sprintf("h%d", i))
		files = append(files, f)
		cmd := command(store, "run", "--permits", "2", "sem", "--", "sh", "-c",
			fmt.Sprintf(`echo "$DLOCK_PERMIT $DLOCK_FENCE $DLOCK_PERMIT_KEY" > %s.tmp; mv %s.tmp %s; exec sleep 60`, f, f, f))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); <-done })
		holders = append(holders, cmd)
		awaitFile(t, f)
	}
	seen := map[string]bool{}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		var permit int
		var fence uint64
		var slot string
		if _, err := fmt.Sscan(string(b), &permit, &fence, &slot); err != nil || fence == 0 || slot != fmt.Sprintf("sem/permit-%d", permit) {
			t.Fatalf("holder environment %q (%v)", b, err)
		}
		seen[slot] = true
		// The slot is a key of its own, held under that fence.
		res := dlock(t, store, "fence", "check", slot, fmt.Sprint(fence))
		wantCode(t, res, 0)
	}
	if len(seen) != 2 {
		t.Fatalf("two holders on the same slot: %v", seen)
	}
	marker := filepath.Join(dir, "third")
	res := dlock(t, store, "run", "--permits", "2", "sem", "--", "touch", marker)
	wantCode(t, res, 75)
	mustNotExist(t, marker, "a third holder of 2 permits")
	if !strings.Contains(res.stderr, "all 2 permits") {
		t.Fatalf("stderr %q: want it to say all permits are held", res.stderr)
	}
	wantCode(t, dlock(t, store, "run", "--permits", "2", "--conflict-exit-code", "0", "sem", "--", "touch", marker), 0)
	mustNotExist(t, marker, "--conflict-exit-code 0")
	// A waiter gets the slot the first holder frees.
	go func() { time.Sleep(300 * time.Millisecond); _ = holders[0].Process.Signal(syscall.SIGTERM) }()
	res = dlock(t, store, "run", "--permits", "2", "--wait-timeout", "20s", "sem", "--", "sh", "-c", "echo $DLOCK_PERMIT")
	wantCode(t, res, 0)
	first, _ := os.ReadFile(files[0])
	if got := strings.TrimSpace(res.stdout); !strings.HasPrefix(string(first), got+" ") {
		t.Fatalf("waiter got permit %q, want the freed one (%q)", got, first)
	}
	for _, bad := range []string{"-1", "1025", "x"} {
		wantCode(t, dlock(t, store, "run", "--permits", bad, "sem", "--", "true"), 64)
	}
}

// Item 7: --conflict-exit-code (flock -E) and -c/--shell (flock -c).
func TestRun_ConflictExitCodeAndShell(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	startHolder(t, store, "cx:key")
	wantCode(t, dlock(t, store, "run", "--conflict-exit-code", "3", "cx:key", "--", "true"), 3)
	wantCode(t, dlock(t, store, "run", "--conflict-exit-code", "9", "--wait-timeout", "200ms", "cx:key", "--", "true"), 9)
	wantCode(t, dlock(t, store, "run", "--conflict-exit-code", "256", "cx:key", "--", "true"), 64)

	res := dlock(t, store, "run", "-c", `echo "$DLOCK_KEY" | tr a-z A-Z; exit 4`, "sh:key")
	wantCode(t, res, 4)
	if strings.TrimSpace(res.stdout) != "SH:KEY" {
		t.Fatalf("-c stdout %q", res.stdout)
	}
	res = dlock(t, store, "run", "--shell", "echo a b", "sh:key")
	wantCode(t, res, 0)
	if res.stdout != "a b\n" {
		t.Fatalf("--shell stdout %q", res.stdout)
	}
	wantCode(t, dlock(t, store, "run", "-c", "true", "sh:key", "--", "true"), 64)
	wantCode(t, dlock(t, store, "run", "-c", "true"), 64)
}

// Item 7: dlock version names the module version and the VCS revision.
func TestVersion_ModuleAndRevision(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "dlock")
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ Version, Revision string }
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("version -o json %q: %v", out, err)
	}
	if len(v.Revision) != 40 || v.Version == "" || v.Version == "unknown" {
		t.Fatalf("version %+v: want the module version and a 40-hex revision", v)
	}
	// Others may commit while this test runs: the revision must be a commit.
	if err := exec.Command("git", "cat-file", "-e", v.Revision+"^{commit}").Run(); err != nil {
		t.Fatalf("revision %s (HEAD %s) is not a commit of this repository", v.Revision, strings.TrimSpace(string(head)))
	}
	line, _ := exec.Command(bin, "version").Output()
	if !strings.Contains(string(line), v.Version) || !strings.Contains(string(line), "revision "+v.Revision[:12]) {
		t.Fatalf("version line %q: want %s and revision %s", line, v.Version, v.Revision[:12])
	}
	// A build without VCS stamping says so instead of printing nothing.
	res := dlock(t, "mem://", "version")
	if !strings.Contains(res.stdout, "revision") {
		t.Fatalf("version of an unstamped build %q: want it to say the revision is unknown", res.stdout)
	}
}

// Item 7: shell completion of key names from list.
func TestCompletion_KeysFromList(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	startHolder(t, store, "comp:alpha", "--holder", "host-a")
	startHolder(t, store, "comp:beta")
	startHolder(t, store, "other:gamma")
	for _, args := range [][]string{
		{"__complete", "status", "comp:"},
		{"__complete", "run", "--ttl", "1m", "comp:"},
		{"__complete", "release", "--force", "comp:"},
	} {
		res := dlock(t, store, args...)
		wantCode(t, res, 0)
		var keys []string
		for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
			if !strings.HasPrefix(line, ":") {
				keys = append(keys, strings.SplitN(line, "\t", 2)[0])
			}
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"comp:alpha", "comp:beta"}) {
			t.Fatalf("dlock %v: keys %q, want comp:alpha and comp:beta\n%s", args, keys, res.stdout)
		}
	}
	// The command after -- completes as files, not keys.
	res := dlock(t, store, "__complete", "run", "comp:alpha", "--", "")
	if strings.Contains(res.stdout, "comp:beta") {
		t.Fatalf("completion after --: %q", res.stdout)
	}
	// A store that is down offers nothing, quickly.
	start := time.Now()
	res = dlock(t, fmt.Sprintf("redis://127.0.0.1:%d", testservers.FreePort(t)), "__complete", "status", "comp:")
	if strings.Contains(res.stdout, "comp:") || time.Since(start) > 5*time.Second {
		t.Fatalf("completion with the store down: %q after %v", res.stdout, time.Since(start))
	}
	res = dlock(t, store, "completion", "bash")
	wantCode(t, res, 0)
	if !strings.Contains(res.stdout, "__start_dlock") {
		t.Fatalf("completion bash: no script")
	}
}

// runEnv runs dlock with exactly env (plus PATH), not the test's own.
func runEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(dlockBin, args...)
	cmd.Env = append([]string{"PATH=" + filepath.Dir(dlockBin) + ":" + os.Getenv("PATH")}, env...)
	return runCmd(t, cmd)
}

// Item 8: configuration without flags, flag > env > file > default.
func TestConfig_Precedence(t *testing.T) {
	r := testservers.StartRedis(t)
	fileStore, envStore, flagStore := r.URL()+"/1", r.URL()+"/2", r.URL()+"/3"
	home := t.TempDir()
	cfgDir := filepath.Join(home, ".config", "dlock")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(cfgDir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("store: "+fileStore+"\nttl: 7s\nholder: file-holder\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The command reports the store it got and the TTL and holder of its
	// own grant, as status sees them.
	probe := []string{"run", "cfg:key", "--", "sh", "-c", `echo "$DLOCK_STORE"; dlock status -o json "$DLOCK_KEY"`}
	check := func(t *testing.T, res result, store string, ttl float64, holder string) {
		t.Helper()
		wantCode(t, res, 0)
		first, rest, _ := strings.Cut(res.stdout, "\n")
		var st struct {
			TTL    float64 `json:"ttl_seconds"`
			Holder string
		}
		if err := json.Unmarshal([]byte(rest), &st); err != nil {
			t.Fatalf("status %q: %v", rest, err)
		}
		if first != store || st.TTL != ttl || st.Holder != holder {
			t.Fatalf("got store %s ttl %v holder %q, want %s %v %q", first, st.TTL, st.Holder, store, ttl, holder)
		}
	}
	base := []string{"HOME=" + home}
	t.Run("file", func(t *testing.T) {
		check(t, runEnv(t, base, probe...), fileStore, 7, "file-holder")
	})
	t.Run("env over file", func(t *testing.T) {
		env := append(base, "DLOCK_STORE="+envStore, "DLOCK_TTL=9s", "DLOCK_HOLDER=env-holder")
		check(t, runEnv(t, env, probe...), envStore, 9, "env-holder")
	})
	t.Run("flag over env", func(t *testing.T) {
		env := append(base, "DLOCK_STORE="+envStore, "DLOCK_TTL=9s", "DLOCK_HOLDER=env-holder")
		args := append([]string{"--store", flagStore, "run", "--ttl", "11s", "--holder", "flag-holder"}, probe[1:]...)
		check(t, runEnv(t, env, args...), flagStore, 11, "flag-holder")
	})
	t.Run("--config over the default file", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "other.yaml")
		if err := os.WriteFile(other, []byte("store: "+envStore+"\nttl: 13s\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		hostHolder := runEnv(t, base, append([]string{"--config", other}, probe...)...)
		wantCode(t, hostHolder, 0)
		if first, _, _ := strings.Cut(hostHolder.stdout, "\n"); first != envStore || !strings.Contains(hostHolder.stdout, `"ttl_seconds": 13`) {
			t.Fatalf("--config: %q", hostHolder.stdout)
		}
	})
	t.Run("default without file or env", func(t *testing.T) {
		res := runEnv(t, []string{"HOME=" + t.TempDir()}, "run", "--retry-for", "0", "k", "--", "true")
		wantCode(t, res, 69)
		if !strings.Contains(res.stderr, "127.0.0.1:7450") {
			t.Fatalf("default store: %q", res.stderr)
		}
	})
	t.Run("output from the file", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out.yaml")
		if err := os.WriteFile(out, []byte("store: "+fileStore+"\noutput: json\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		res := runEnv(t, base, "--config", out, "status", "cfg:free")
		wantCode(t, res, 0)
		if !json.Valid([]byte(res.stdout)) {
			t.Fatalf("output: json in the file, status printed %q", res.stdout)
		}
	})
	t.Run("token accepted", func(t *testing.T) {
		res := runEnv(t, append(base, "DLOCK_TOKEN=s3cret"), "status", "cfg:free")
		wantCode(t, res, 0)
		loose := filepath.Join(t.TempDir(), "loose.yaml")
		if err := os.WriteFile(loose, []byte("store: "+fileStore+"\ntoken: s3cret\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res = runEnv(t, base, "--config", loose, "status", "cfg:free")
		wantCode(t, res, 0)
		if !strings.Contains(res.stderr, "readable by others") || strings.Contains(res.stderr+res.stdout, "s3cret") {
			t.Fatalf("a token in a world-readable file: stderr %q", res.stderr)
		}
	})
	t.Run("bad configuration is 64", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(bad, []byte("stroe: redis://x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		res := runEnv(t, base, "--config", bad, "status", "k")
		wantCode(t, res, 64)
		if !strings.Contains(res.stderr, bad) || !strings.Contains(res.stderr, "stroe") {
			t.Fatalf("unknown key: %q", res.stderr)
		}
		wantCode(t, runEnv(t, base, "--config", filepath.Join(t.TempDir(), "missing.yaml"), "status", "k"), 64)
		wantCode(t, runEnv(t, append(base, "DLOCK_TTL=soon"), "run", "k", "--", "true"), 64)
		badTTL := filepath.Join(t.TempDir(), "ttl.yaml")
		_ = os.WriteFile(badTTL, []byte("ttl: soon\n"), 0o600)
		wantCode(t, runEnv(t, base, "--config", badTTL, "run", "k", "--", "true"), 64)
	})
	res := dlock(t, "mem://", "--help")
	for _, want := range []string{"precedence", "DLOCK_TTL", "DLOCK_TOKEN", "config.yaml"} {
		if !strings.Contains(res.stdout, want) {
			t.Fatalf("dlock --help does not document %q", want)
		}
	}
}

// Item 9: errors say what happened and what to do.
func TestErrors_SayWhatToDo(t *testing.T) {
	port := testservers.FreePort(t)
	dead := fmt.Sprintf("dlockd://127.0.0.1:%d", port)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for _, args := range [][]string{{"status", "down:key"}, {"run", "--retry-for", "0", "down:key", "--", "true"}} {
		res := dlock(t, dead, args...)
		wantCode(t, res, 69)
		line := strings.TrimSpace(res.stderr)
		if strings.Contains(line, "\n") || strings.Contains(line, "rpc error") || strings.Contains(line, "transport:") {
			t.Fatalf("dlock %v: want one plain line, got %q", args, line)
		}
		for _, want := range []string{`"down:key"`, addr, "connection refused", "is dlockd running at " + addr + "? set --store or DLOCK_STORE"} {
			if !strings.Contains(line, want) {
				t.Fatalf("dlock %v: %q lacks %q", args, line, want)
			}
		}
	}
	res := dlock(t, "127.0.0.1:7450", "status", "k")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "dlockd://127.0.0.1:7450") {
		t.Fatalf("--store host:port: %q, want the dlockd:// suggestion", res.stderr)
	}
	res = dlock(t, "http://127.0.0.1:7450", "status", "k")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "dlockd, dynamodb, etcd") || strings.Contains(res.stderr, "import") {
		t.Fatalf("--store http://: %q, want the supported schemes (and nothing about imports)", res.stderr)
	}
	res = dlock(t, "mem://", "run", "k", "ls", "-la")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "--") || !strings.Contains(res.stderr, "KEY -- COMMAND") {
		t.Fatalf("run without --: %q", res.stderr)
	}
	res = dlock(t, "mem://", "run", "k", "ls")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "missing -- between KEY and the command") {
		t.Fatalf("run without --: %q", res.stderr)
	}
	res = dlock(t, "mem://", "fence", "check", "k")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "$DLOCK_FENCE") {
		t.Fatalf("fence check without a fence: %q", res.stderr)
	}
	res = dlock(t, "mem://", "fence", "check", "k", "")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "DLOCK_FENCE") {
		t.Fatalf("fence check with an empty fence: %q", res.stderr)
	}
	wantCode(t, dlock(t, "mem://", "release", "--force", "k", "--reason", "   "), 64)

	eachStore(t, func(t *testing.T, store string) {
		startHolder(t, store, "held:key", "--holder", "host-3 pid 4242")
		res := dlock(t, store, "run", "held:key", "--", "true")
		wantCode(t, res, 75)
		if !regexp.MustCompile(`held by host-3 pid 4242 for [0-9.]+m?s more \(TTL 30s\), fence [1-9]`).MatchString(res.stderr) {
			t.Fatalf("held: %q, want who holds it, for how long and its fence", res.stderr)
		}
	})
}

// Item 10: -o json covers errors: {"error", "code", "exit_code"} on stdout
// for the commands that own it; run's report goes to --report.
func TestJSON_Errors(t *testing.T) {
	dead := fmt.Sprintf("redis://127.0.0.1:%d", testservers.FreePort(t))
	type jerr struct {
		Error    string
		Code     string
		ExitCode *int `json:"exit_code"`
	}
	want := func(t *testing.T, res result, code string, exitCode int) {
		t.Helper()
		wantCode(t, res, exitCode)
		var j jerr
		if err := json.Unmarshal([]byte(res.stdout), &j); err != nil || j.Error == "" || j.Code != code || j.ExitCode == nil || *j.ExitCode != exitCode {
			t.Fatalf("stdout %q (%v): want {error, code %q, exit_code %d}", res.stdout, err, code, exitCode)
		}
	}
	for _, args := range [][]string{
		{"status", "k"}, {"list"}, {"release", "--force", "k", "--reason", "x"}, {"fence", "check", "k", "1"},
	} {
		want(t, dlock(t, dead, append([]string{"-o", "json"}, args...)...), "unavailable", 69)
	}
	store := testservers.StartRedis(t).URL()
	want(t, dlock(t, store, "-o", "json", "release", "--force", "free:key", "--reason", "x"), "not_held", 1)
	want(t, dlock(t, store, "-o", "json", "status", ""), "invalid_argument", 64)
	want(t, dlock(t, store, "-o", "json", "fence", "check", "k", "abc"), "invalid_argument", 64)
	rs := testservers.StartRedisN(t, 3)
	redlock := "redlock://" + rs[0].Addr() + "," + rs[1].Addr() + "," + rs[2].Addr()
	want(t, dlock(t, redlock, "-o", "json", "list"), "unsupported", 78)

	// run: stdout is the command's alone; the report goes to --report.
	startHolder(t, store, "json:held")
	rep := filepath.Join(t.TempDir(), "report.json")
	res := dlock(t, store, "run", "-o", "json", "--report", rep, "json:held", "--", "echo", "ran")
	wantCode(t, res, 75)
	var r struct {
		Result, Code, Error string
		ExitCode            int `json:"exit_code"`
	}
	b, _ := os.ReadFile(rep)
	if err := json.Unmarshal(b, &r); err != nil || r.Code != "held" || r.ExitCode != 75 || !strings.Contains(r.Error, "held by") {
		t.Fatalf("report %q (%v)", b, err)
	}
	if res.stdout != "" || strings.Contains(res.stderr, "{") {
		t.Fatalf("run -o json --report: stdout %q stderr %q, want neither to hold the report", res.stdout, res.stderr)
	}
	// fd:3, and a run that ran: the child's stdout untouched.
	rf, wf, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := command(store, "run", "--report", "fd:3", "json:free", "--", "echo", "ran")
	cmd.ExtraFiles = []*os.File{wf}
	out, err := cmd.Output()
	wf.Close()
	if err != nil || string(out) != "ran\n" {
		t.Fatalf("run --report fd:3: %v, stdout %q", err, out)
	}
	b = make([]byte, 4096)
	n, _ := rf.Read(b)
	rf.Close()
	if err := json.Unmarshal(b[:n], &r); err != nil || r.Result != "ran" || r.ExitCode != 0 {
		t.Fatalf("report on fd 3 %q (%v)", b[:n], err)
	}
	wantCode(t, dlock(t, store, "run", "--report", "fd:97", "json:free", "--", "true"), 64)
	wantCode(t, dlock(t, store, "run", "--report", "/no/such/dir/r.json", "json:free", "--", "true"), 64)
	// Without --report, -o json's report is the last line of stderr.
	res = dlock(t, store, "run", "-o", "json", "json:held", "--", "echo", "ran")
	lines := strings.Split(strings.TrimSpace(res.stderr), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil || r.Code != "held" || res.stdout != "" {
		t.Fatalf("run -o json without --report: stderr %q", res.stderr)
	}
}

// Item 11: control characters in keys cannot break list or status; fence
// check on a free key says free; bench leaves nothing behind.
func TestInspection_ControlCharsQuotedAndFreeFence(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		key := "ctl\nkey\x1b[31m"
		startHolder(t, store, key)
		res := dlock(t, store, "list", "ctl")
		wantCode(t, res, 0)
		lines := strings.Split(strings.TrimRight(res.stdout, "\n"), "\n")
		if len(lines) != 2 || !strings.Contains(lines[1], `"ctl\nkey\x1b[31m"`) || strings.Contains(res.stdout, "\x1b") {
			t.Fatalf("list with a control character in a key: %q", res.stdout)
		}
		res = dlock(t, store, "status", key)
		wantCode(t, res, 0)
		if !strings.Contains(res.stdout, `key:      "ctl\nkey\x1b[31m"`) || strings.Contains(res.stdout, "\x1b") {
			t.Fatalf("status: %q", res.stdout)
		}
		res = dlock(t, store, "fence", "check", "free:key", "1")
		wantCode(t, res, 1)
		if strings.TrimSpace(res.stdout) != "not current (the key is free)" {
			t.Fatalf("fence check of a free key: %q", res.stdout)
		}
	})
}

func TestBench_CleansUpRedis(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := redisWithUserData(t, ctx, r)
	res := dlock(t, r.URL(), "bench", "--clients", "2", "--contended", "2", "--duration", "200ms", "--hold-keys", "300", "-o", "json")
	wantCode(t, res, 0)
	wantOnlyUserData(t, ctx, c, "bench")
}

// A --reason the store would refuse is a usage error (64), checked before
// the store is asked, and the grant stays.
func TestRelease_InvalidReasonIs64(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		startHolder(t, store, "reason:key")
		for _, reason := range []string{strings.Repeat("r", 1025), "line one\nforged log line", "   "} {
			res := dlock(t, store, "release", "--force", "reason:key", "--reason", reason)
			wantCode(t, res, 64)
		}
		wantCode(t, dlock(t, store, "run", "reason:key", "--", "true"), 75)
		wantCode(t, dlock(t, store, "release", "--force", "reason:key", "--reason", strings.Repeat("r", 1024)), 0)
	})
}

// SIGTERM while dlock run retries a store that is down ends it at once with
// 128+15; the command never runs.
func TestRun_SignalDuringRetryIs143(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	dead := fmt.Sprintf("redis://127.0.0.1:%d", testservers.FreePort(t))
	cmd := command(dead, "run", "--retry-for", "60s", "sig:retry", "--", "touch", marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	time.Sleep(time.Second)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 143 {
			t.Fatalf("SIGTERM during the retry: %v, want exit 143", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("dlock run still retrying 10s after SIGTERM")
	}
	mustNotExist(t, marker, "after SIGTERM")
}

// During dlockd's lock-delay after a force release, status does not call a
// key with a queued waiter free.
func TestStatus_LockDelayIsNotFree(t *testing.T) {
	p := servertest.StartProcess(t)
	store := "dlockd://" + p.Addr() + "?lock_delay=5s"
	startHolder(t, store, "delay:key", "--ttl", "1h")
	waiter := command(store, "run", "--wait-timeout", "30s", "delay:key", "--", "true")
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	waiterDone := make(chan error, 1)
	go func() { waiterDone <- waiter.Wait() }()
	defer func() { _ = waiter.Process.Kill(); <-waiterDone }()
	awaitWaiters(t, store, "delay:key", 1)
	wantCode(t, dlock(t, store, "release", "--force", "delay:key", "--reason", "test"), 0)
	res := dlock(t, store, "status", "delay:key")
	wantCode(t, res, 0)
	select {
	case <-waiterDone:
		t.Fatal("the waiter was granted within the 5s lock-delay")
	default:
	}
	if strings.Contains(res.stdout, "free") || !strings.Contains(res.stdout, "1 waiter(s) queued") {
		t.Fatalf("status during the lock-delay: %q", res.stdout)
	}
}
