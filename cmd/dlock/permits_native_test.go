package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server/servertest"
)

// TestRun_PermitsNativeOnDlockd: on dlockd, --permits N holds one of N
// counted grants of KEY/permit-shared (package recipe/semaphore's native
// scheme): each holder its own fence, DLOCK_PERMIT_KEY names the key and
// DLOCK_PERMIT is unset; the next holder is refused naming the key, and a
// --wait waiter is handed the permit a holder frees.
func TestRun_PermitsNativeOnDlockd(t *testing.T) {
	store := "dlockd://" + servertest.StartProcess(t).Addr()
	dir := t.TempDir()
	var holders []*exec.Cmd
	fences := map[string]bool{}
	for i := range 2 {
		f := filepath.Join(dir, fmt.Sprintf("h%d", i))
		cmd := command(store, "run", "--permits", "2", "sem", "--", "sh", "-c",
			fmt.Sprintf(`echo "$DLOCK_PERMIT_KEY $DLOCK_FENCE ${DLOCK_PERMIT-unset}" > %s.tmp; mv %s.tmp %s; exec sleep 60`, f, f, f))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); <-done })
		holders = append(holders, cmd)
		awaitFile(t, f)
		b, _ := os.ReadFile(f)
		var key, fence, permit string
		if _, err := fmt.Sscan(string(b), &key, &fence, &permit); err != nil || key != "sem/permit-shared" || permit != "unset" || fence == "0" {
			t.Fatalf("holder environment %q (%v): want DLOCK_PERMIT_KEY sem/permit-shared, a fence, no DLOCK_PERMIT", b, err)
		}
		fences[fence] = true
	}
	if len(fences) != 2 {
		t.Fatalf("two permits with one fence: %v", fences)
	}
	marker := filepath.Join(dir, "third")
	res := dlock(t, store, "run", "--permits", "2", "sem", "--", "touch", marker)
	wantCode(t, res, 75)
	mustNotExist(t, marker, "a third holder of 2 permits")
	if !strings.Contains(res.stderr, "all 2 permits (sem/permit-shared) are held") {
		t.Fatalf("stderr %q: want it to say all permits of sem/permit-shared are held", res.stderr)
	}
	go func() { time.Sleep(300 * time.Millisecond); _ = holders[0].Process.Signal(syscall.SIGTERM) }()
	res = dlock(t, store, "run", "--permits", "2", "--wait-timeout", "20s", "sem", "--", "sh", "-c", "echo $DLOCK_PERMIT_KEY")
	wantCode(t, res, 0)
	if got := strings.TrimSpace(res.stdout); got != "sem/permit-shared" {
		t.Fatalf("waiter ran with DLOCK_PERMIT_KEY %q", got)
	}
	// Another N on the same key is refused while it has permits (usage).
	wantCode(t, dlock(t, store, "run", "--permits", "3", "sem", "--", "true"), 64)
}
