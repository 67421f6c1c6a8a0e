package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/internal/testcerts"
	"github.com/dlock-dev/dlock/server"
)

// freeAddr returns a free 127.0.0.1 address.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRun_ConfigFilesExit2: a start refused for a file the configuration
// names (a missing or broken auth file, certificate, key or CA, an audit
// log that cannot be written) exits 2, so that systemd
// (RestartPreventExitStatus=2) does not restart it every 2 s for ever; a
// data directory locked by another dlockd exits 1 (worth a retry). They
// all used to exit 1.
func TestRun_ConfigFilesExit2(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "CA")
	leaf := ca.Issue(t, "dlockd")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	readOnly := filepath.Join(dir, "ro")
	if err := os.Mkdir(readOnly, 0o500); err != nil {
		t.Fatal(err)
	}
	base := func() []string {
		return []string{"--listen", freeAddr(t), "--raft-bind", freeAddr(t), "--data", t.TempDir(), "--raft-log-level", "off"}
	}
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"missing auth file":     {[]string{"--auth-file", missing}, missing},
		"broken auth file":      {[]string{"--auth-file", garbage}, garbage},
		"missing certificate":   {[]string{"--tls-cert", missing, "--tls-key", leaf.KeyFile}, missing},
		"broken key":            {[]string{"--tls-cert", leaf.CertFile, "--tls-key", garbage}, garbage},
		"unreadable client CA":  {[]string{"--tls-cert", leaf.CertFile, "--tls-key", leaf.KeyFile, "--tls-client-ca", missing}, missing},
		"broken peer CA":        {[]string{"--peer-cert", leaf.CertFile, "--peer-key", leaf.KeyFile, "--peer-ca", garbage}, garbage},
		"unwritable audit log":  {[]string{"--audit-log", filepath.Join(readOnly, "sub", "audit.log")}, "audit"},
		"missing peer key file": {[]string{"--peer-cert", leaf.CertFile, "--peer-key", missing, "--peer-ca", ca.CertFile}, missing},
	} {
		t.Run(name, func(t *testing.T) {
			if os.Geteuid() == 0 && name == "unwritable audit log" {
				// root writes anywhere: make the path's parent a file.
				c.args = []string{"--audit-log", filepath.Join(garbage, "audit.log")}
			}
			var stdout, stderr bytes.Buffer
			code := run(append(base(), c.args...), &stdout, &stderr)
			if code != 2 {
				t.Fatalf("dlockd %v: exit %d, want 2\nstderr: %s", c.args, code, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("dlockd %v: stderr %q does not name %q", c.args, stderr.String(), c.want)
			}
		})
	}
}

// TestRun_LockedDataDirExits1: a data directory another dlockd holds is
// not a configuration error: exit 1 (the service manager may retry).
func TestRun_LockedDataDirExits1(t *testing.T) {
	data := t.TempDir()
	cfg := server.DefaultConfig()
	cfg.Listen, cfg.RaftBind, cfg.DataDir, cfg.RaftLogLevel = freeAddr(t), freeAddr(t), data, "off"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	holder, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	var stdout, stderr bytes.Buffer
	code := run([]string{"--listen", freeAddr(t), "--raft-bind", freeAddr(t), "--data", data, "--raft-log-level", "off"}, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("dlockd on a locked data dir: exit %d, want 1\nstderr: %s", code, stderr.String())
	}
}
