package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestAudit_ReloadNamesItsSourceAndTLSFailure: a reload is audited with
// the identity of what asked for it ("signal:SIGHUP" for dlockd's, not
// "anonymous"), and one whose TLS part fails is audited "failed" with the
// reason (it used to be audited "ok", from the auth file alone).
func TestAudit_ReloadNamesItsSourceAndTLSFailure(t *testing.T) {
	dir := t.TempDir()
	audit := filepath.Join(dir, "audit.log")
	ids := []servertest.Identity{{Name: "ops", Rules: map[string][]string{"": {"admin", "lock"}}}}
	authFile := servertest.WriteAuthFile(t, dir, ids)
	srv, _, leaf := startTLS(t, func(c *server.Config) {
		c.AuthFile, c.AuditLogFile = authFile, audit
	})
	if err := srv.Server().ReloadAs("signal:SIGHUP"); err != nil {
		t.Fatal(err)
	}
	lines := waitAudit(t, audit, func(ls []map[string]any) bool { return len(ls) >= 2 })
	for _, l := range lines[:2] {
		if l["identity"] != "signal:SIGHUP" || l["result"] != "ok" {
			t.Fatalf("reload line %v: want identity signal:SIGHUP, result ok", l)
		}
	}
	if lines[0]["action"] != "auth-reload" || lines[1]["action"] != "tls-reload" {
		t.Fatalf("reload lines %v: want auth-reload then tls-reload", lines)
	}
	// The certificate file broken: the TLS part fails.
	if err := os.WriteFile(leaf.CertFile, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := srv.Server().Reload()
	if err == nil {
		t.Fatal("Reload with a broken certificate file: nil error")
	}
	lines = waitAudit(t, audit, func(ls []map[string]any) bool { return len(ls) >= 4 })
	auth, tlsl := lines[2], lines[3]
	if auth["action"] != "auth-reload" || auth["result"] != "ok" || auth["identity"] != "operator" {
		t.Fatalf("auth part of the second reload: %v", auth)
	}
	if tlsl["action"] != "tls-reload" || tlsl["result"] != "failed" || tlsl["identity"] != "operator" || !strings.Contains(tlsl["reason"].(string), filepath.Base(leaf.CertFile)) {
		t.Fatalf("TLS part of the second reload: %v; want result failed naming %s (error %v)", tlsl, leaf.CertFile, err)
	}
}
