package deploy_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// exampleDir holds the example cluster's files.
const exampleDir = "examples/cluster-tls"

// exampleAddrs are the addresses of the example's node configs, by node:
// API, then Raft.
var exampleAddrs = [3][2]string{
	{"127.0.0.1:7450", "127.0.0.1:7451"},
	{"127.0.0.1:7460", "127.0.0.1:7461"},
	{"127.0.0.1:7470", "127.0.0.1:7471"},
}

// TestExampleClusterTLS_DoneWhen is the "Done when": a 3-node TLS +
// token cluster runs from examples/cluster-tls with the systemd unit's
// command line, and dlock run works against it with the payments token,
// which has lock on "payout:", and is denied on "settle:" (exit status 77,
// naming the key and the permission). It builds dlockd and dlock, runs
// gen-certs.sh, copies the configs with free loopback ports and temporary
// data directories, starts the members with ExecStart (the config path
// substituted) and stops them by PID.
func TestExampleClusterTLS_DoneWhen(t *testing.T) {
	needTool(t, "openssl", "install Debian's openssl package: apt-get install openssl")
	start := time.Now()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if out, err := exec.Command("go", "build", "-o", bin+string(filepath.Separator),
		"github.com/dlock-dev/dlock/cmd/dlockd", "github.com/dlock-dev/dlock/cmd/dlock").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dlockd, dlockCLI := filepath.Join(bin, "dlockd"), filepath.Join(bin, "dlock")

	// Certificates, by the example's script, into dir/tls.
	script, err := filepath.Abs(filepath.Join(exampleDir, "gen-certs.sh"))
	if err != nil {
		t.Fatal(err)
	}
	gen := exec.Command(script, "tls")
	gen.Dir = dir
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("gen-certs.sh: %v\n%s", err, out)
	}
	for _, f := range []string{"ca.pem", "n1.pem", "n1-key.pem", "n2.pem", "n3-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, "tls", f)); err != nil {
			t.Fatalf("gen-certs.sh made no %s: %v", f, err)
		}
	}
	copyFile(t, filepath.Join(exampleDir, "auth.yaml"), filepath.Join(dir, "auth.yaml"))
	token := strings.TrimSpace(readFile(t, filepath.Join(exampleDir, "tokens", "payments.token")))

	// The node configs, with free ports and temporary data directories.
	var ports [3][2]string
	var configs [3]string
	free := freePorts(t, 6)
	for i := range 3 {
		ports[i] = [2]string{free[2*i], free[2*i+1]}
	}
	for i := range 3 {
		id := fmt.Sprintf("n%d", i+1)
		text := readFile(t, filepath.Join(exampleDir, id+".yaml"))
		for j := range 3 {
			for k := range 2 {
				// Its own API address, and every Raft address (--initial-cluster).
				if (j == i || k == 1) && !strings.Contains(text, exampleAddrs[j][k]) {
					t.Fatalf("%s.yaml does not name %s: the test's address table is out of date", id, exampleAddrs[j][k])
				}
				text = strings.ReplaceAll(text, exampleAddrs[j][k], ports[j][k])
			}
		}
		data := filepath.Join(dir, "data", id)
		text, n := replaceLine(text, "data: ", "data: "+data)
		if n != 1 {
			t.Fatalf("%s.yaml has %d data: lines, want 1", id, n)
		}
		configs[i] = filepath.Join(dir, id+".yaml")
		if err := os.WriteFile(configs[i], []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// The unit's command line, binary and config path substituted.
	execStart := unitExecStart(t)
	var procs []*exec.Cmd
	var logs []*bytes.Buffer
	stopAll := func() {
		for i, p := range procs {
			if p.ProcessState != nil {
				continue
			}
			_ = p.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Errorf("n%d (pid %d) did not stop within 10s of SIGTERM: killed", i+1, p.Process.Pid)
				_ = p.Process.Kill()
				<-done
			}
		}
	}
	t.Cleanup(func() {
		stopAll()
		if t.Failed() {
			for i, l := range logs {
				t.Logf("n%d log:\n%s", i+1, tail(l.String(), 40))
			}
		}
	})
	for i := range 3 {
		args := make([]string, 0, len(execStart))
		for _, a := range execStart[1:] {
			if a == unitConfig {
				a = configs[i]
			}
			args = append(args, a)
		}
		if execStart[0] != unitBinary {
			t.Fatalf("ExecStart runs %s, want %s", execStart[0], unitBinary)
		}
		cmd := exec.Command(dlockd, args...)
		cmd.Dir = dir // the example's relative paths: tls/, auth.yaml, the audit logs
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs, logs = append(procs, cmd), append(logs, &log)
		t.Logf("n%d: pid %d: dlockd %s", i+1, cmd.Process.Pid, strings.Join(args, " "))
	}

	// A leader: one member's /readyz answers 200 over TLS.
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(readFile(t, filepath.Join(dir, "tls", "ca.pem")))) {
		t.Fatal("tls/ca.pem: no certificate")
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	leader := -1
	for deadline := time.Now().Add(30 * time.Second); leader < 0; time.Sleep(100 * time.Millisecond) {
		for i := range 3 {
			if procs[i].ProcessState != nil {
				t.Fatalf("n%d exited: %v", i+1, procs[i].ProcessState)
			}
			resp, err := client.Get("https://" + ports[i][0] + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					leader = i
				}
			}
		}
		if leader < 0 && time.Now().After(deadline) {
			t.Fatal("no member ready (a leader) within 30s")
		}
	}
	t.Logf("leader n%d after %v", leader+1, time.Since(start).Round(time.Millisecond))
	// Plaintext is refused on the TLS port.
	if resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + ports[leader][0] + "/readyz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP to the TLS API port answered 200")
		}
	}

	store := fmt.Sprintf("dlockd://%s,%s,%s?ca=%s", ports[0][0], ports[1][0], ports[2][0], filepath.Join(dir, "tls", "ca.pem"))
	run := func(key string) (int, string) {
		t.Helper()
		var out bytes.Buffer
		cmd := exec.Command(dlockCLI, "run", key, "--", "true")
		cmd.Env = append(cleanEnv(dir), "DLOCK_STORE="+store, "DLOCK_TOKEN="+token)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, out.String()
		case errors.As(err, &ee):
			return ee.ExitCode(), out.String()
		}
		t.Fatalf("dlock run %s: %v", key, err)
		return -1, ""
	}
	if code, out := run("payout:2026-12"); code != 0 {
		t.Errorf("dlock run payout:2026-12 -- true with the payments token: exit %d, want 0\n%s", code, out)
	}
	code, out := run("settle:x")
	if code != 77 {
		t.Errorf("dlock run settle:x -- true with the payments token: exit %d, want 77 (EX_NOPERM)\n%s", code, out)
	}
	for _, want := range []string{"settle:x", "lock"} {
		if !strings.Contains(out, want) {
			t.Errorf("dlock run settle:x: message does not name %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, token) {
		t.Errorf("dlock run settle:x: the message shows the token:\n%s", out)
	}
	t.Logf("denied: %s", strings.TrimSpace(out))

	// The denial is in some member's audit log, by identity name, without
	// the token.
	var audit strings.Builder
	for i := range 3 {
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("n%d-audit.log", i+1)))
		audit.Write(b)
	}
	if a := audit.String(); !strings.Contains(a, "settle:x") || !strings.Contains(a, "payments") || strings.Contains(a, token) {
		t.Errorf("audit logs: want the denial of settle:x to payments, without the token:\n%s", a)
	}

	stopAll()
	for i, p := range procs {
		if !p.ProcessState.Success() {
			t.Errorf("n%d: exit %v after SIGTERM, want 0", i+1, p.ProcessState)
		}
	}
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}

// cleanEnv returns the environment without DLOCK_* variables and with a
// HOME and XDG_CONFIG_HOME of the test's own, so that no config file of
// the user's reaches the CLI.
func cleanEnv(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "DLOCK_") || strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
}

// replaceLine replaces every line that starts with prefix by line, and
// returns the text and how many lines it replaced.
func replaceLine(text, prefix, line string) (string, int) {
	lines := strings.Split(text, "\n")
	n := 0
	for i, l := range lines {
		if strings.HasPrefix(l, prefix) {
			lines[i] = line
			n++
		}
	}
	return strings.Join(lines, "\n"), n
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	if err := os.WriteFile(to, []byte(readFile(t, from)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// freePorts returns n distinct loopback host:ports that were free a
// moment ago. Their listeners stay open until all n are chosen: one closed
// before the next was asked for could be handed out again (a node's API
// port was once another's Raft port, and the node could not start).
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
