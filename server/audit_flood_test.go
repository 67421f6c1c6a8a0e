package server_test

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// TestAudit_UnauthenticatedFloodIsAggregated: 300 requests with bad tokens
// from one IP write one audit line (they used to rotate every earlier
// line out of a 4 KiB, 3-file audit log), while the metric counts all
// 300; an admin action before and after the flood keeps its line; a known
// identity's denials stay one line each.
func TestAudit_UnauthenticatedFloodIsAggregated(t *testing.T) {
	f := startAuth(t, func(c *server.Config) {
		c.AuditLogMaxBytes = 4096
		c.AuditLogMaxFiles = 3
	})
	c := grpcClient(t, f.e.Addr())
	ctx := t.Context()
	if _, err := c.Acquire(withToken(ctx, f.tok("admin")), acquireReq("payout:1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ForceRelease(withToken(ctx, f.tok("admin")), &dlockv1.ForceReleaseRequest{Key: "payout:1", Reason: "before the flood"}); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if i%2 == 0 {
			_, err := c.Acquire(withToken(ctx, "dlk_bad_token"), acquireReq("payout:2"))
			wantCode(t, "bad token", err, codes.Unauthenticated)
		} else if code, _, _ := httpDo(t, f.e.Addr(), "POST", "/v1/acquire", `{"key":"payout:2","owner":"owner-payout-2-abcdef"}`, "dlk_bad_token"); code != 401 {
			t.Fatalf("HTTP bad token: %d", code)
		}
	}
	for i := range 5 {
		_, err := c.Acquire(withToken(ctx, f.tok("locker")), acquireReq("settle:"+strings.Repeat("y", i)))
		wantCode(t, "denied", err, codes.PermissionDenied)
	}
	if _, err := c.Acquire(withToken(ctx, f.tok("admin")), acquireReq("payout:1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ForceRelease(withToken(ctx, f.tok("admin")), &dlockv1.ForceReleaseRequest{Key: "payout:1", Reason: "after the flood"}); err != nil {
		t.Fatal(err)
	}
	lines := waitAudit(t, f.audit, func(ls []map[string]any) bool {
		return len(ls) > 0 && ls[len(ls)-1]["reason"] == "after the flood"
	})
	var unauth, denied int
	var reasons []string
	for _, l := range lines {
		switch l["result"] {
		case "UNAUTHENTICATED":
			unauth++
		case "PERMISSION_DENIED":
			denied++
		}
		if l["action"] == "force-release" {
			reasons = append(reasons, l["reason"].(string))
		}
	}
	if unauth != 1 || denied != 5 || strings.Join(reasons, ",") != "before the flood,after the flood" {
		t.Fatalf("audit log: %d UNAUTHENTICATED lines (want 1), %d PERMISSION_DENIED (want 5), force releases %v (want both); lines %v", unauth, denied, reasons, lines)
	}
	if _, err := os.Stat(f.audit + ".1"); err == nil {
		t.Fatalf("the audit log rotated: the flood still takes room")
	}
	m := metricsText(t, f.e.Addr())
	for _, want := range []string{
		`dlockd_audit_events_total{action="deny",result="UNAUTHENTICATED"} 300`,
		`dlockd_audit_events_total{action="deny",result="PERMISSION_DENIED"} 5`,
		`dlockd_audit_events_total{action="force-release",result="ok"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
}

// TestAudit_FloodWithoutAuditFile: without an audit log the refusals go to
// the server's log: 100 bad tokens make one line, and 100 denials of one
// identity one line too (each is counted in the metric).
func TestAudit_FloodWithoutAuditFile(t *testing.T) {
	f := startAuth(t, func(c *server.Config) { c.AuditLogFile = "" })
	c := grpcClient(t, f.e.Addr())
	ctx := t.Context()
	for range 100 {
		_, err := c.Acquire(withToken(ctx, "dlk_bad_token"), acquireReq("payout:2"))
		wantCode(t, "bad token", err, codes.Unauthenticated)
		_, err = c.Acquire(withToken(ctx, f.tok("locker")), acquireReq("settle:1"))
		wantCode(t, "denied", err, codes.PermissionDenied)
	}
	var unauth, denied int
	for _, l := range strings.Split(f.logs.String(), "\n") {
		if !strings.Contains(l, "dlockd: audit") {
			continue
		}
		switch {
		case strings.Contains(l, "result=UNAUTHENTICATED"):
			unauth++
		case strings.Contains(l, "result=PERMISSION_DENIED"):
			denied++
		}
	}
	if unauth != 1 || denied != 1 {
		t.Fatalf("server log: %d UNAUTHENTICATED audit lines, %d PERMISSION_DENIED; want 1 each:\n%s", unauth, denied, f.logs.String())
	}
	m := metricsText(t, f.e.Addr())
	for _, want := range []string{
		`dlockd_audit_events_total{action="deny",result="UNAUTHENTICATED"} 100`,
		`dlockd_audit_events_total{action="deny",result="PERMISSION_DENIED"} 100`,
	} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
	_ = http.StatusOK
}
