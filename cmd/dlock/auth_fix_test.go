package main_test

import (
	"bytes"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server/servertest"
)

// TestAuth_RunHidesTokenFromCommand: the command dlock run starts does not
// get DLOCK_TOKEN (dlock's credential) in its environment, while it gets
// DLOCK_KEY and the rest of dlock's; --token's help says a flag shows in ps.
func TestAuth_RunHidesTokenFromCommand(t *testing.T) {
	p, toks, _, _ := authDlockd(t)
	store := "dlockd://" + p.Addr()
	cmd := command(store, "run", "payout:env", "--", "env")
	cmd.Env = append(cmd.Env, "DLOCK_TOKEN="+toks["worker"], "DLOCK_TEST_MARK=kept")
	r := runCmd(t, cmd)
	wantCode(t, r, 0)
	if strings.Contains(r.stdout, "DLOCK_TOKEN") || strings.Contains(r.stdout, toks["worker"]) {
		t.Fatalf("the command's environment holds the token:\n%s", r.stdout)
	}
	for _, want := range []string{"DLOCK_KEY=payout:env", "DLOCK_TEST_MARK=kept", "DLOCK_FENCE="} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("the command's environment lacks %s:\n%s", want, r.stdout)
		}
	}
	h := dlock(t, store, "run", "--help")
	if !strings.Contains(h.stdout+h.stderr, "visible to every user in ps") {
		t.Fatalf("--token's help does not warn that a flag shows in ps:\n%s", h.stdout)
	}
}

// TestAuth_RunRevokedTokenStopsCommand: a dlock run whose token is revoked
// (SIGHUP to dlockd) while its command runs loses the lease at the first
// refused renewal: the command is stopped and dlock exits 70, naming the
// refusal, after one or two refused calls (they used to be retried about
// ten times a second until the lease ran out). The reload is audited as
// identity "signal:SIGHUP".
func TestAuth_RunRevokedTokenStopsCommand(t *testing.T) {
	p, toks, authFile, audit := authDlockd(t)
	store := "dlockd://" + p.Addr()
	cmd := command(store, "run", "--ttl", "6s", "--grace", "1s", "payout:long", "--", "sleep", "600")
	cmd.Env = append(cmd.Env, "DLOCK_TOKEN="+toks["worker"])
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r := dlockAs(t, store, toks["ops"], "status", "payout:long"); r.code == 0 && strings.Contains(r.stdout, "held") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("payout:long never held; dlock run: %s", errb.String())
		}
	}
	before := auditCount(t, p.Addr(), "UNAUTHENTICATED")
	servertest.WriteAuthFile(t, filepath.Dir(authFile), []servertest.Identity{
		{Name: "ops", Token: toks["ops"], Rules: map[string][]string{"": {"admin", "lock"}}},
	})
	if err := syscall.Kill(p.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	awaitAudit(t, audit, `"identity":"signal:SIGHUP","action":"auth-reload","key":"","reason":"1 identities","result":"ok"`)
	var code int
	select {
	case err := <-done:
		code = cmd.ProcessState.ExitCode()
		_ = err
	case <-time.After(15 * time.Second):
		t.Fatalf("dlock run still running 15 s after its token was revoked; stderr: %s", errb.String())
	}
	if code != 70 || !strings.Contains(errb.String(), "permission denied") || !strings.Contains(errb.String(), "lost") {
		t.Fatalf("dlock run: exit %d, stderr %s; want 70 naming the lost lease and the refusal", code, errb.String())
	}
	if strings.Contains(errb.String(), toks["worker"]) {
		t.Fatal("stderr holds the token")
	}
	if n := auditCount(t, p.Addr(), "UNAUTHENTICATED") - before; n > 3 {
		t.Fatalf("%d refused calls after the revocation, want at most 3 (one renewal, the stream's reopening)", n)
	}
}

// auditCount reads dlockd_audit_events_total{action="deny",result=result}
// from dlockd's /metrics (0 when absent).
func auditCount(t *testing.T, addr, result string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	prefix := `dlockd_audit_events_total{action="deny",result="` + result + `"} `
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	return 0
}

// TestAuth_DenialIsOneCleanLine: a refusal reads once, naming the
// identity, the key (or, for a list, the prefix) and the missing
// permission (it used to say "permission denied: the server refused the
// acquire: permission denied: ... (PERMISSION_DENIED)").
func TestAuth_DenialIsOneCleanLine(t *testing.T) {
	p, toks, _, _ := authDlockd(t)
	store := "dlockd://" + p.Addr()
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"run", "settle:1", "--", "true"}, []string{`permission denied: identity "worker" lacks lock on key "settle:1"`}},
		{[]string{"list", "settle:"}, []string{`permission denied: identity "worker" lacks read on any key under the prefix "settle:"`}},
		{[]string{"cluster", "status"}, []string{`permission denied: identity "worker" lacks read on the prefix ""`}},
	}
	for _, c := range cases {
		r := dlockAs(t, store, toks["worker"], c.args...)
		wantNoPerm(t, r, toks, c.want...)
		line := strings.TrimSpace(r.stderr)
		if strings.Count(line, "\n") != 0 || strings.Count(line, "permission denied") != 1 || strings.Contains(line, "PERMISSION_DENIED") || strings.Contains(line, "refused the") {
			t.Errorf("dlock %s: stderr %q; want one line saying permission denied once, without the reason code", strings.Join(c.args, " "), line)
		}
	}
}

// TestToken_RuleWithoutSeparatorWarns: a --rule prefix that ends in a
// letter or digit matches more than it seems (byte prefixes): token new
// warns on stderr and suggests the prefix with a separator; a prefix with
// one, and "", get no warning.
func TestToken_RuleWithoutSeparatorWarns(t *testing.T) {
	r := dlock(t, "mem://", "token", "new", "x", "--rule", "payout=lock")
	wantCode(t, r, 0)
	for _, want := range []string{"warning", `"payout"`, `"payouts-internal:1"`, `did you mean "payout:"`} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("stderr %q lacks %q", r.stderr, want)
		}
	}
	if strings.Contains(r.stdout, "warning") {
		t.Fatalf("the warning went to stdout: %s", r.stdout)
	}
	r = dlock(t, "mem://", "token", "new", "x", "--rule", "payout:=lock", "--rule", "=read", "--rule", "jobs/=lock")
	wantCode(t, r, 0)
	if r.stderr != "" {
		t.Fatalf("warning for prefixes with a separator: %q", r.stderr)
	}
}
