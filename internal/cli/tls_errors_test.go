package cli

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server/servertest"
)

// TestTLS_CLIErrorsSayWhy: against a dlockd that requires client
// certificates, a client certificate it refuses (expired) or none exits
// 77 (EX_NOPERM) naming the cause, for dlock run and dlock cluster status
// (it used to exit 69 with "connection closed before the HTTP/2 preface
// ... is dlockd running?"); with server_name=n2 and a server certificate
// that does not name n2, the message names the name checked and the
// certificate's names (it used to say "does not name this address: set
// server_name=NAME" though server_name was set). No TLS error ends with
// "is dlockd running at ...?".
func TestTLS_CLIErrorsSayWhy(t *testing.T) {
	apiCA := servertest.NewCA(t, "API CA")
	clients := servertest.NewCA(t, "clients CA")
	leaf := apiCA.Issue(t, "dlockd")
	cfg := servertest.Config(t, t.TempDir())
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSClientCAFile = leaf.CertFile, leaf.KeyFile, clients.CertFile
	srv := servertest.StartEmbedded(t, cfg)
	e := url.QueryEscape
	good := clients.Issue(t, "app")
	expired := clients.IssueWith(t, "app", servertest.LeafOptions{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Minute)})
	store := func(l *servertest.Leaf, extra string) string {
		s := "dlockd://" + srv.Addr() + "?ca=" + e(apiCA.CertFile) + extra
		if l != nil {
			s += "&cert=" + e(l.CertFile) + "&key=" + e(l.KeyFile)
		}
		return s
	}
	for _, c := range []struct {
		name  string
		args  []string
		code  int
		wants []string
	}{
		{"run, expired certificate", []string{"--store", store(expired, ""), "run", "--retry-for", "0s", "k", "--", "true"}, ExitNoPerm,
			[]string{"expired", "cert=FILE"}},
		{"run, no certificate", []string{"--store", store(nil, ""), "run", "--retry-for", "0s", "k", "--", "true"}, ExitNoPerm,
			[]string{"client certificate is required", "cert=FILE"}},
		{"cluster status, expired certificate", []string{"--store", store(expired, ""), "cluster", "status", "--retry-for", "0s", "--timeout", "3s"}, ExitNoPerm,
			[]string{"expired", "cert=FILE"}},
		{"run, server_name not in the certificate", []string{"--store", store(good, "&server_name=n2"), "run", "--retry-for", "0s", "k", "--", "true"}, ExitUnavailable,
			[]string{`does not name "n2"`, "server_name=n2", "localhost", "127.0.0.1"}},
		{"cluster status, server_name not in the certificate", []string{"--store", store(good, "&server_name=n2"), "cluster", "status", "--retry-for", "0s", "--timeout", "3s"}, ExitUnavailable,
			[]string{`does not name "n2"`, "localhost"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\n%s", code, c.code, errOut)
			}
			for _, w := range c.wants {
				if !strings.Contains(errOut, w) {
					t.Fatalf("stderr lacks %q:\n%s", w, errOut)
				}
			}
			for _, bad := range []string{"running at", "are the members running", "preface", "set server_name=NAME"} {
				if strings.Contains(errOut, bad) {
					t.Fatalf("stderr says %q:\n%s", bad, errOut)
				}
			}
			t.Logf("exit %d: %s", code, strings.TrimSpace(errOut))
		})
	}
}
