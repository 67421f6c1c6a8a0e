package main_test

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestVerify_BadInputIsRefusedFirst: every setting dlock verify and dlock
// verify matrix cannot use is refused with exit 64 before any store starts
// (so at once) and before anything is written; the message names it.
func TestVerify_BadInputIsRefusedFirst(t *testing.T) {
	out := t.TempDir()
	choosing := filepath.Join(out, "CHOOSING.md")
	if err := os.WriteFile(choosing, []byte("keep me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	afile := filepath.Join(out, "a-file")
	if err := os.WriteFile(afile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"verify", "--store", "dlockd", "--ttl", "10ms"}, "TTL 10ms outside"},
		{[]string{"verify", "--store", "dlockd", "--ttl", "-1s"}, "must not be negative"},
		{[]string{"verify", "--store", "redis://127.0.0.1:1", "--ttl", "99ms"}, "TTL 99ms outside"},
		{[]string{"verify", "--store", "dlockd", "--fault", "bogus"}, `unknown fault "bogus"`},
		{[]string{"verify", "--store", "dlockd", "--duration", "4s"}, "shorter than 5 TTLs"},
		{[]string{"verify", "--store", "dlockd", "--clients", "-3"}, "must not be negative"},
		{[]string{"verify", "--store", "dlockd", "--clients", "300"}, "300 clients"},
		{[]string{"verify", "--store", "dlockd", "--keys", "9223372036854775807"}, "keys: want 1 to"},
		{[]string{"verify", "--store", "nosuchstore"}, "neither a store URL"},
		{[]string{"verify", "--store", "dlockd", "--json", filepath.Join(afile, "x.json")}, "cannot write"},
		{[]string{"verify", "matrix", "--stores", "redsi", "--out", out}, `no store "redsi"`},
		{[]string{"verify", "matrix", "--faults", "bogus", "--out", out}, `no fault "bogus"`},
		{[]string{"verify", "matrix", "--runs", "-1", "--out", out}, "-1 runs"},
		{[]string{"verify", "matrix", "--ttl", "-1s", "--out", out}, "must not be negative"},
		{[]string{"verify", "matrix", "--stores", "redis", "--out", filepath.Join(afile, "sub")}, "not a directory"},
	}
	for _, c := range cases {
		start := time.Now()
		r := dlock(t, "", c.args...)
		if r.code != 64 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("dlock %s: exit %d, stderr %q; want 64 and %q", strings.Join(c.args, " "), r.code, r.stderr, c.want)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("dlock %s took %v to refuse: it started something first", strings.Join(c.args, " "), d)
		}
	}
	if b, _ := os.ReadFile(choosing); string(b) != "keep me\n" {
		t.Errorf("a refused matrix rewrote %s: %q", choosing, b)
	}
	if _, err := os.Stat(filepath.Join(out, "GUARANTEES.md")); err == nil {
		t.Error("a refused matrix wrote GUARANTEES.md")
	}
}

// TestVerify_NothingMeasuredIsNotAPass: a store URL where nothing grants
// (a silent port) makes dlock verify exit 69, not 0.
func TestVerify_NothingMeasuredIsNotAPass(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accepted, never answered
		}
	}()
	r := dlock(t, "", "verify", "--store", "dlockd://"+ln.Addr().String(), "--duration", "5s", "--ttl", "1s")
	if r.code != 69 || !strings.Contains(r.stderr, "granted nothing") && !strings.Contains(r.stderr, "unavailable") {
		t.Fatalf("verify against a silent port: exit %d, stderr %q; want 69", r.code, r.stderr)
	}
}

// TestVerify_InterruptedRunIsNotJudged: SIGINT in the middle of a run
// exits 130 at once, says it was interrupted and writes no result.
func TestVerify_InterruptedRunIsNotJudged(t *testing.T) {
	rd := testservers.StartRedis(t)
	res := filepath.Join(t.TempDir(), "r.json")
	// --debug prints the fault plan as it runs: its first line says the
	// run is under way.
	cmd := command("", "verify", "--debug", "--fault", "blackhole", "--store", rd.URL(), "--duration", "30s", "--json", res)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	started, copied := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pipe)
		for first := true; sc.Scan(); first = false {
			stderr.WriteString(sc.Text() + "\n")
			if first {
				close(started)
			}
		}
	}()
	done := make(chan error, 1)
	go func() { <-copied; done <- cmd.Wait() }()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("verify --debug printed nothing within 20 s")
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("verify did not end within 10 s of SIGINT")
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	}
	if code != 130 || !strings.Contains(stderr.String(), "interrupted") {
		t.Fatalf("interrupted verify: exit %d (%v), stderr %q; want 130 and interrupted", code, err, stderr.String())
	}
	if _, err := os.Stat(res); err == nil {
		t.Fatal("an interrupted run wrote its result")
	}
}
