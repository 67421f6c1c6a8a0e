package main_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/server/servertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servertest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestDlockd_LogsAddressServesAndStopsOnSIGTERM runs the binary: one log line
// says where it listens and where its data is, curl-style JSON works, and
// SIGTERM shuts it down with exit status 0.
func TestDlockd_LogsAddressServesAndStopsOnSIGTERM(t *testing.T) {
	bin := servertest.Binary(t)
	listen, raftBind, data := servertest.FreePort(t), servertest.FreePort(t), filepath.Join(t.TempDir(), "data")
	cmd := exec.Command(bin, "--listen", listen, "--data", data, "--raft-bind", raftBind, "--raft-log-level", "off")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var first string
	select {
	case first = <-lines:
	case <-time.After(10 * time.Second):
		t.Fatal("no log line")
	}
	if !strings.Contains(first, "listen="+listen) || !strings.Contains(first, "data="+data) {
		t.Fatalf("first log line %q does not say where it listens and where its data is", first)
	}
	deadline := time.Now().Add(10 * time.Second)
	var body string
	for {
		resp, err := http.Post("http://"+listen+"/v1/acquire", "application/json", strings.NewReader(`{"key":"k","ttl":"30s"}`))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				body = string(b)
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquire never succeeded: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(body, `"fence"`) {
		t.Fatalf("acquire answer %s", body)
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for range lines {
		}
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("dlockd did not stop after SIGTERM")
	}
}

func TestDlockd_BadFlagsExit2(t *testing.T) {
	bin := servertest.Binary(t)
	for _, args := range [][]string{{"--nope"}, {"--max-ttl", "1ms"}, {"--listen", "no-port"}, {"--log-level", "loud"}} {
		err := exec.Command(bin, args...).Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("dlockd %v: %v, want exit status 2", args, err)
		}
	}
}
