package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// TestDlockd_BadFlagsExit2: a bad flag, value, argument or configuration
// exits 2 with one line on stderr.
func TestDlockd_BadFlagsExit2(t *testing.T) {
	bin := servertest.Binary(t)
	for _, args := range [][]string{
		{"--nope"}, {"--max-ttl", "1ms"}, {"--listen", "no-port"}, {"--log-level", "loud"},
		{"--log-format", "xml"}, {"--max-ttl", "soon"}, {"serve"}, {"--gc-headroom-bytes", "-1"}, {"--gc-headroom-bytes", "16MiB"}, {"--gc-percent", "-5"},
	} {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("dlockd %v: %v, want exit status 2", args, err)
		}
		msg := stderr.String()
		if strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "dlockd") || stdout.Len() != 0 {
			t.Errorf("dlockd %v: stderr %q, stdout %q: want one line on stderr", args, msg, stdout.String())
		}
	}
}

// TestDlockd_HelpExits0: --help and -h print the flags on stdout and exit 0.
func TestDlockd_HelpExits0(t *testing.T) {
	bin := servertest.Binary(t)
	for _, arg := range []string{"--help", "-h"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil {
			t.Fatalf("dlockd %s: %v", arg, err)
		}
		for _, want := range []string{"Usage: dlockd", "--listen", "--log-level", "--log-format", "--version"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("dlockd %s: output lacks %q:\n%s", arg, want, out)
			}
		}
	}
}

// buildBoth builds dlockd and dlock with one go build, so that both carry
// the same VCS stamp, and returns their paths.
func buildBoth(t *testing.T) (dlockd, dlock string) {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+string(filepath.Separator),
		"github.com/dlock-dev/dlock/cmd/dlockd", "github.com/dlock-dev/dlock/cmd/dlock").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "dlockd"), filepath.Join(dir, "dlock")
}

// TestVersion_SameLineFromBothBinaries: dlockd --version and dlock version
// print the same line (module version, revision, Go version, platform),
// each naming its own program, and dlock version -o json the same facts as
// an object.
func TestVersion_SameLineFromBothBinaries(t *testing.T) {
	dlockd, dlock := buildBoth(t)
	server, err := exec.Command(dlockd, "--version").Output()
	if err != nil {
		t.Fatalf("dlockd --version: %v", err)
	}
	cli, err := exec.Command(dlock, "version").Output()
	if err != nil {
		t.Fatalf("dlock version: %v", err)
	}
	if !strings.HasPrefix(string(server), "dlockd ") || strings.TrimPrefix(string(server), "dlockd ") != strings.TrimPrefix(string(cli), "dlock ") {
		t.Fatalf("dlockd --version %q: want dlock version's line %q naming dlockd", server, cli)
	}
	line := strings.TrimSuffix(string(cli), "\n")
	platform := runtime.GOOS + "/" + runtime.GOARCH
	if strings.Contains(line, "\n") || !strings.HasPrefix(line, "dlock ") || !strings.HasSuffix(line, " "+runtime.Version()+" "+platform) {
		t.Fatalf("version line %q: want one line \"dlock VERSION [(revision ...)] %s %s\"", line, runtime.Version(), platform)
	}

	js, err := exec.Command(dlock, "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("dlock version -o json: %v", err)
	}
	var v struct {
		Version  string `json:"version"`
		Revision string `json:"revision"`
		Modified bool   `json:"modified"`
		Go       string `json:"go"`
		Platform string `json:"platform"`
	}
	if err := json.Unmarshal(js, &v); err != nil {
		t.Fatalf("dlock version -o json: %q: %v", js, err)
	}
	if v.Go != runtime.Version() || v.Platform != platform || v.Version == "" || !strings.HasPrefix(line, "dlock "+v.Version+" ") {
		t.Fatalf("dlock version -o json %+v does not match the line %q", v, line)
	}
	if len(v.Revision) >= 12 && !strings.Contains(line, "(revision "+v.Revision[:12]) {
		t.Fatalf("line %q does not name revision %s", line, v.Revision)
	}
}

// TestDlockd_JSONLogsWithoutWarningsOnStart runs the binary with
// --log-format json at the default level: every line is a JSON object,
// Raft's included (component "raft"), and a normal start and stop of a
// single node logs no warning.
func TestDlockd_JSONLogsWithoutWarningsOnStart(t *testing.T) {
	bin := servertest.Binary(t)
	listen, raftBind, data := servertest.FreePort(t), servertest.FreePort(t), filepath.Join(t.TempDir(), "data")
	cmd := exec.Command(bin, "--listen", listen, "--data", data, "--raft-bind", raftBind, "--log-format", "json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	type line struct {
		raw string
		m   map[string]any
	}
	lines := make(chan line, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			_ = json.Unmarshal(sc.Bytes(), &m)
			lines <- line{sc.Text(), m}
		}
		close(lines)
	}()
	var all []line
	next := func() line {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("dlockd exited; log:\n%v", all)
			}
			all = append(all, l)
			return l
		case <-time.After(15 * time.Second):
			t.Fatalf("no log line in 15s; log:\n%v", all)
		}
		return line{}
	}
	for next().m["msg"] != "dlockd: leader and ready" {
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		all = append(all, l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	raft := false
	for _, l := range all {
		if l.m == nil {
			t.Errorf("log line is not JSON: %q", l.raw)
			continue
		}
		if lv := l.m["level"]; lv != "INFO" {
			t.Errorf("normal start and stop logged at %v: %s", lv, l.raw)
		}
		if l.m["component"] == "raft" {
			raft = true
		}
	}
	if !raft {
		t.Errorf("no Raft line in the log: %v", all)
	}
}
