package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
)

// startKilled starts `dlock run --resume-file file KEY` with a command that
// writes its fence= line to a file and sleeps, waits until the resume file
// is written, SIGKILLs dlock (as an OOM kill or a node's reboot of the job
// would) and returns the fence the command saw.
func startKilled(t *testing.T, store, file, key, ttl string) uint64 {
	t.Helper()
	kill, fence := startResumable(t, store, file, key, ttl)
	kill()
	return fence
}

// startResumable starts `dlock run --resume-file file KEY` as startKilled
// does, and returns a func that SIGKILLs it, and the command's fence.
func startResumable(t *testing.T, store, file, key, ttl string) (kill func(), fence uint64) {
	t.Helper()
	fenceFile := filepath.Join(t.TempDir(), "fence")
	cmd := command(store, "run", "--resume-file", file, "--ttl", ttl, "--grace", "1s", key, "--",
		"sh", "-c", "echo fence=$DLOCK_FENCE > "+fenceFile+"; exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	awaitFile(t, fenceFile)
	awaitFile(t, file)
	// The shell creates the file before echo writes into it: wait for the
	// whole line, not just the file.
	var b []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if b, err = os.ReadFile(fenceFile); err != nil {
			kill()
			t.Fatal(err)
		}
		if strings.HasSuffix(string(b), "\n") || time.Now().After(deadline) {
			break
		}
	}
	return kill, fenceOf(t, string(b))
}

type runReport struct {
	Result  string `json:"result"`
	Fence   uint64 `json:"fence"`
	Resumed bool   `json:"resumed"`
}

func lastReport(t *testing.T, stderr string) runReport {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	var rep runReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("no JSON report as the last stderr line: %v\n%s", err, stderr)
	}
	return rep
}

// TestRun_ResumeFileKeepsLeaseAfterKill: dlock run is SIGKILLed while its
// command runs; re-executed with the same --resume-file it resumes the
// lease: the command sees the same DLOCK_FENCE, the report says resumed,
// the file is 0600 while held and removed at the end.
func TestRun_ResumeFileKeepsLeaseAfterKill(t *testing.T) { eachStore(t, testRunResumeFile) }

func testRunResumeFile(t *testing.T, store string) {
	file := filepath.Join(t.TempDir(), "job.lease")
	kill, fence := startResumable(t, store, file, "resume:job", "5s")
	// A second run with the same file while the first is alive (a job
	// overlapping itself) must not resume the first one's lease.
	r := dlock(t, store, "run", "--resume-file", file, "resume:job", "--", "echo", "ran twice")
	wantCode(t, r, 75)
	if !strings.Contains(r.stderr, "still alive") || strings.Contains(r.stdout, "ran twice") {
		t.Errorf("an overlapping run with the same resume file: stdout %q, stderr:\n%s", r.stdout, r.stderr)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the overlapping run removed the live run's resume file: %v", err)
	}
	kill()
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatalf("resume file gone after dlock was killed: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("resume file mode %#o, want 0600", fi.Mode().Perm())
	}
	// Another holder cannot take the key meanwhile: the lease is alive.
	r = dlock(t, store, "run", "resume:job", "--", "true")
	wantCode(t, r, 75)

	r = dlock(t, store, "run", "-o", "json", "--resume-file", file, "--ttl", "5s", "resume:job", "--", "sh", "-c", "echo fence=$DLOCK_FENCE")
	wantCode(t, r, 0)
	if got := fenceOf(t, r.stdout); got != fence {
		t.Errorf("re-executed job saw fence %d, want the resumed %d\nstderr: %s", got, fence, r.stderr)
	}
	if rep := lastReport(t, r.stderr); !rep.Resumed || rep.Fence != fence || rep.Result != "ran" {
		t.Errorf("report %+v, want resumed, fence %d, ran", rep, fence)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("resume file still there after run ended: %v", err)
	}
	// Released: the key is free again, and a new run gets a greater fence.
	r = dlock(t, store, "run", "resume:job", "--", "sh", "-c", "echo fence=$DLOCK_FENCE")
	wantCode(t, r, 0)
	if got := fenceOf(t, r.stdout); got <= fence {
		t.Errorf("next run's fence %d not greater than %d", got, fence)
	}
}

// TestRun_ResumeFileStaleIsReplaced: a resume file is never trusted beyond
// what the store confirms: the file of a lease that expired since is
// reported and replaced by a fresh acquisition (greater fence); a file
// writable by others, or for another key, is reported and not used.
func TestRun_ResumeFileStaleIsReplaced(t *testing.T) { eachStore(t, testRunResumeStale) }

func testRunResumeStale(t *testing.T, store string) {
	dir := t.TempDir()
	file := filepath.Join(dir, "job.lease")
	fence := startKilled(t, store, file, "resume:stale", "1s")
	time.Sleep(2 * time.Second) // the grant expires on the store
	r := dlock(t, store, "run", "-o", "json", "--resume-file", file, "--ttl", "5s", "resume:stale", "--",
		"sh", "-c", "echo fence=$DLOCK_FENCE; cat "+file)
	wantCode(t, r, 0)
	if !strings.Contains(r.stderr, "no longer held") || !strings.Contains(r.stderr, "acquiring afresh") {
		t.Errorf("stale file not reported on stderr:\n%s", r.stderr)
	}
	got := fenceOf(t, r.stdout)
	if got <= fence {
		t.Errorf("fresh acquisition's fence %d not greater than the stale %d", got, fence)
	}
	if rep := lastReport(t, r.stderr); rep.Resumed {
		t.Errorf("report says resumed for a stale file: %+v", rep)
	}
	if !strings.Contains(r.stdout, `"fence":`) || strings.Count(r.stdout, "fence=") != 1 {
		t.Errorf("the file was not replaced by the fresh lease's token while the command ran:\n%s", r.stdout)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("resume file still there after run ended: %v", err)
	}

	// A live lease's file made writable by others is not trusted: run
	// waits for the old grant to expire and takes a new fence.
	fence = startKilled(t, store, file, "resume:mode", "2s")
	if err := os.Chmod(file, 0o666); err != nil {
		t.Fatal(err)
	}
	r = dlock(t, store, "run", "--resume-file", file, "--wait-timeout", "20s", "--ttl", "5s", "resume:mode", "--", "sh", "-c", "echo fence=$DLOCK_FENCE")
	wantCode(t, r, 0)
	if !strings.Contains(r.stderr, "not trusted") {
		t.Errorf("a world-writable resume file not reported:\n%s", r.stderr)
	}
	if got := fenceOf(t, r.stdout); got <= fence {
		t.Errorf("fence %d after an untrusted file, want a fresh one > %d", got, fence)
	}

	// A file for another key is not used for this one.
	fence = startKilled(t, store, file, "resume:a", "5s")
	r = dlock(t, store, "run", "--resume-file", file, "resume:b", "--", "sh", "-c", "echo fence=$DLOCK_FENCE")
	wantCode(t, r, 0)
	if !strings.Contains(r.stderr, `not on "resume:b"`) {
		t.Errorf("a file for another key not reported:\n%s", r.stderr)
	}
}

// TestRun_MaxHoldTerminatesCommand: --max-hold ends the lease at the bound
// although renewals succeed: the command is terminated, exit 70, and the
// message names --max-hold; a negative bound is exit 64.
func TestRun_MaxHoldTerminatesCommand(t *testing.T) { eachStore(t, testRunMaxHold) }

func testRunMaxHold(t *testing.T, store string) {
	start := time.Now()
	r := dlock(t, store, "run", "--max-hold", "1500ms", "--ttl", "1s", "--grace", "1s", "maxhold:job", "--", "sleep", "30")
	wantCode(t, r, 70)
	if took := time.Since(start); took < 1500*time.Millisecond || took > 15*time.Second {
		t.Errorf("run took %v with --max-hold 1.5s", took)
	}
	if !strings.Contains(r.stderr, "--max-hold") {
		t.Errorf("stderr does not name --max-hold:\n%s", r.stderr)
	}
	wantCode(t, dlock(t, store, "run", "--max-hold", "-1s", "maxhold:bad", "--", "true"), 64)
	wantCode(t, dlock(t, store, "run", "--resume-file", "/nonexistent-dir/x", "maxhold:bad", "--", "true"), 64)
}

// TestRun_ResumeFilePastMaxHold: --max-hold counts from the first grant
// across re-executions: a saved lease older than --max-hold is released,
// said on stderr, and the re-executed job runs under a fresh lease.
func TestRun_ResumeFilePastMaxHold(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	file := filepath.Join(t.TempDir(), "job.lease")
	fenceFile := filepath.Join(t.TempDir(), "fence")
	// --max-hold 4s: the command has started (and written its fence)
	// long before, even on a loaded machine.
	cmd := command(store, "run", "--resume-file", file, "--max-hold", "4s", "--ttl", "30s", "--grace", "1s", "maxhold:resume", "--",
		"sh", "-c", "echo fence=$DLOCK_FENCE > "+fenceFile+"; exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	awaitFile(t, fenceFile)
	awaitFile(t, file)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	b, _ := os.ReadFile(fenceFile)
	fence := fenceOf(t, string(b))
	time.Sleep(4200 * time.Millisecond) // past --max-hold, well within the 30 s TTL
	r := dlock(t, store, "run", "--resume-file", file, "--max-hold", "4s", "--ttl", "30s", "maxhold:resume", "--", "sh", "-c", "echo fence=$DLOCK_FENCE")
	wantCode(t, r, 0)
	if !strings.Contains(r.stderr, "past --max-hold") {
		t.Errorf("stderr does not say the saved lease passed --max-hold:\n%s", r.stderr)
	}
	if got := fenceOf(t, r.stdout); got <= fence {
		t.Errorf("fence %d, want a fresh one > %d", got, fence)
	}
}
