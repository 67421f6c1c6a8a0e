package testservers

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const deathsigChildEnv = "DLOCK_TESTSERVERS_DEATHSIG_CHILD"

// TestMain lets TestStartProcess_DiesWithItsParent run this test binary
// as the parent that is killed.
func TestMain(m *testing.M) {
	if os.Getenv(deathsigChildEnv) != "" {
		h := NewHarness(nil)
		if err := h.Run(func() {
			r := StartRedis(h)
			fmt.Println("redis pid", r.PID())
		}); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		time.Sleep(time.Minute) // killed -9 by the test long before
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestStartProcess_DiesWithItsParent: a server started by a process that
// is then killed -9 (no cleanup runs) dies with it.
func TestStartProcess_DiesWithItsParent(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), deathsigChildEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	pid := 0
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), "redis pid "); ok {
			pid, _ = strconv.Atoi(s)
			break
		}
		t.Logf("child: %s", sc.Text())
	}
	if pid <= 0 {
		t.Fatal("the child started no redis-server (is it installed? make test installs it)")
	}
	if syscall.Kill(pid, 0) != nil {
		t.Fatalf("redis-server %d is not running", pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			return // gone, or a zombie waiting for init
		}
		if time.Now().After(end) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server %d outlived its parent's kill -9 by 10 s", pid)
		}
	}
}
