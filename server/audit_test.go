package server_test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// TestAudit_DenialAndForceRelease: a denial (gRPC and HTTP), an
// unauthenticated call and a force release are each one JSON line with
// time, identity, action, key, reason and result; the metric counts them;
// no token appears in the audit file or the server's log.
func TestAudit_DenialAndForceRelease(t *testing.T) {
	f := startAuth(t, nil)
	c := grpcClient(t, f.e.Addr())
	ctx := t.Context()
	_, err := c.Acquire(withToken(ctx, f.tok("locker")), acquireReq("settle:1"))
	wantCode(t, "denied acquire", err, codes.PermissionDenied)
	if _, err := c.Acquire(withToken(ctx, f.tok("locker")), acquireReq("payout:1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ForceRelease(withToken(ctx, f.tok("admin")), &dlockv1.ForceReleaseRequest{Key: "payout:1", Reason: "stuck job"}); err != nil {
		t.Fatal(err)
	}
	code, _, _ := httpDo(t, f.e.Addr(), "POST", "/v1/inspect", `{"key":"settle:2"}`, f.tok("locker"))
	if code != 403 {
		t.Fatalf("HTTP inspect by locker: %d", code)
	}
	_, err = c.Acquire(withToken(ctx, "dlk_wrong_token_text"), acquireReq("payout:2"))
	wantCode(t, "unknown token", err, codes.Unauthenticated)

	lines := waitAudit(t, f.audit, func(ls []map[string]any) bool { return len(ls) >= 4 })
	for _, l := range lines {
		for _, k := range []string{"time", "identity", "action", "key", "reason", "result"} {
			if _, ok := l[k]; !ok {
				t.Fatalf("audit line %v lacks %q", l, k)
			}
		}
		if _, err := time.Parse(time.RFC3339Nano, l["time"].(string)); err != nil {
			t.Fatalf("audit time %v: %v", l["time"], err)
		}
	}
	find := func(pred func(map[string]any) bool) map[string]any {
		for _, l := range lines {
			if pred(l) {
				return l
			}
		}
		t.Fatalf("no such audit line in %v", lines)
		return nil
	}
	d := find(func(l map[string]any) bool { return l["key"] == "settle:1" })
	if d["identity"] != "locker" || d["result"] != "PERMISSION_DENIED" || d["action"] != "Lock/Acquire" || !strings.Contains(d["reason"].(string), "lock") {
		t.Fatalf("denial line %v", d)
	}
	fr := find(func(l map[string]any) bool { return l["action"] == "force-release" })
	if fr["identity"] != "admin" || fr["key"] != "payout:1" || fr["reason"] != "stuck job" || fr["result"] != "ok" {
		t.Fatalf("force release line %v", fr)
	}
	h := find(func(l map[string]any) bool { return l["key"] == "settle:2" })
	if h["identity"] != "locker" || h["action"] != "POST /v1/inspect" || h["result"] != "PERMISSION_DENIED" || h["remote"] == "" {
		t.Fatalf("HTTP denial line %v", h)
	}
	u := find(func(l map[string]any) bool { return l["result"] == "UNAUTHENTICATED" })
	if u["identity"] != "anonymous" || !strings.Contains(u["reason"].(string), "unknown token") {
		t.Fatalf("unauthenticated line %v", u)
	}
	// Counted.
	m := metricsText(t, f.e.Addr())
	for _, want := range []string{
		`dlockd_audit_events_total{action="deny",result="PERMISSION_DENIED"} 2`,
		`dlockd_audit_events_total{action="deny",result="UNAUTHENTICATED"} 1`,
		`dlockd_audit_events_total{action="force-release",result="ok"} 1`,
		`dlockd_audit_write_errors_total 0`,
	} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
	// No token text anywhere: the audit file, the server's log (at
	// debug), the metrics.
	audit, _ := os.ReadFile(f.audit)
	for _, id := range f.ids {
		for what, text := range map[string]string{"audit log": string(audit), "server log": f.logs.String(), "metrics": m} {
			if strings.Contains(text, id.Token) {
				t.Fatalf("%s holds %s's token", what, id.Name)
			}
		}
	}
	for what, text := range map[string]string{"audit log": string(audit), "server log": f.logs.String()} {
		if strings.Contains(text, "dlk_wrong_token_text") {
			t.Fatalf("%s holds the unknown token's text", what)
		}
	}
}

// metricsText scrapes /metrics.
func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestAudit_RotatesBySize: with a small AuditLogMaxBytes the file is
// rotated to FILE.1, FILE.2, ... keeping AuditLogMaxFiles rotated files,
// each at most the limit, every line whole JSON.
func TestAudit_RotatesBySize(t *testing.T) {
	f := startAuth(t, func(c *server.Config) {
		c.AuditLogMaxBytes = 1024
		c.AuditLogMaxFiles = 2
	})
	c := grpcClient(t, f.e.Addr())
	for i := range 40 {
		_, err := c.Acquire(withToken(t.Context(), f.tok("locker")), acquireReq("settle:"+strings.Repeat("x", i)))
		wantCode(t, "denied", err, codes.PermissionDenied)
	}
	// 40 lines of about 300 bytes: far more than 3 files of 1 KiB.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err3 := os.Stat(f.audit + ".3")
		_, err2 := os.Stat(f.audit + ".2")
		if err2 == nil {
			if err3 == nil {
				t.Fatalf("%s.3 exists: AuditLogMaxFiles 2 keeps two rotated files", f.audit)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("audit log not rotated twice")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := f.e.Stop(); err != nil { // flushes the writer
		t.Fatal(err)
	}
	for _, p := range []string{f.audit, f.audit + ".1", f.audit + ".2"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 1024 {
			t.Fatalf("%s: %d bytes > 1024", p, st.Size())
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, want 0600", p, st.Mode().Perm())
		}
		waitAudit(t, p, func(ls []map[string]any) bool { return len(ls) > 0 })
	}
	// The newest line is in FILE; the files hold the last lines in order.
	b, _ := os.ReadFile(f.audit)
	if !strings.Contains(string(b), strings.Repeat("x", 39)) {
		t.Fatalf("the newest line is not in %s", filepath.Base(f.audit))
	}
}
