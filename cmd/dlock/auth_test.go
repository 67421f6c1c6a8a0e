package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server/servertest"
)

// authDlockd starts the dlockd binary with an auth file: "worker" may lock
// "payout:", "viewer" may read "payout:", "ops" has admin and lock and
// read on "". It returns the process, the identities (with tokens), the
// auth file and the audit log.
func authDlockd(t *testing.T) (*servertest.Process, map[string]string, string, string) {
	t.Helper()
	dir := t.TempDir()
	ids := []servertest.Identity{
		{Name: "worker", Rules: map[string][]string{"payout:": {"lock"}}},
		{Name: "viewer", Rules: map[string][]string{"payout:": {"read"}}},
		{Name: "ops", Rules: map[string][]string{"": {"admin", "lock"}}},
	}
	authFile := servertest.WriteAuthFile(t, dir, ids)
	audit := filepath.Join(dir, "audit.log")
	p := servertest.StartProcess(t, "--auth-file", authFile, "--audit-log", audit)
	toks := map[string]string{}
	for _, id := range ids {
		toks[id.Name] = id.Token
	}
	return p, toks, authFile, audit
}

// dlockAs runs the dlock binary against store with DLOCK_TOKEN=tok ("" for
// none).
func dlockAs(t *testing.T, store, tok string, args ...string) result {
	t.Helper()
	cmd := command(store, args...)
	if tok != "" {
		cmd.Env = append(cmd.Env, "DLOCK_TOKEN="+tok)
	}
	return runCmd(t, cmd)
}

// wantNoPerm fails unless r exited 77 with every string of want on
// stderr, and no token text anywhere in its output.
func wantNoPerm(t *testing.T, r result, toks map[string]string, want ...string) {
	t.Helper()
	wantCode(t, r, 77)
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Fatalf("stderr %q lacks %q", r.stderr, w)
		}
	}
	for name, tok := range toks {
		if strings.Contains(r.stdout+r.stderr, tok) {
			t.Fatalf("output holds %s's token", name)
		}
	}
}

// TestAuth_CLIExit77: the dlock binary with DLOCK_TOKEN (and --token): each
// permission allowed, and denied with exit 77 (EX_NOPERM) and a message
// naming the key and the permission, for run, status, list, release
// --force, fence check and cluster status; no token, an unknown token;
// -o json's code.
func TestAuth_CLIExit77(t *testing.T) {
	p, toks, _, _ := authDlockd(t)
	store := "dlockd://" + p.Addr()

	wantCode(t, dlockAs(t, store, toks["worker"], "run", "payout:1", "--", "true"), 0)
	r := dlockAs(t, store, toks["worker"], "run", "settle:1", "--", "true")
	wantNoPerm(t, r, toks, `"settle:1"`, "lock", "permission denied")
	r = dlockAs(t, store, "", "--token", toks["viewer"], "run", "payout:1", "--", "true")
	wantNoPerm(t, r, toks, "lock")
	r = dlockAs(t, store, "", "run", "payout:1", "--", "true")
	wantNoPerm(t, r, toks, "requires a token")
	r = dlockAs(t, store, "dlk_not_a_token", "run", "payout:1", "--", "true")
	wantNoPerm(t, r, toks, "unknown token", "DLOCK_TOKEN")
	if strings.Contains(r.stderr, "dlk_not_a_token") {
		t.Fatalf("stderr quotes the token: %s", r.stderr)
	}
	r = dlockAs(t, store, toks["worker"], "-o", "json", "run", "settle:1", "--", "true")
	wantCode(t, r, 77)
	var rep struct{ Code string }
	if err := json.Unmarshal([]byte(r.stderr), &rep); err != nil || rep.Code != "permission_denied" { // run's report is on stderr
		t.Fatalf("-o json: %q (%v), want code permission_denied", r.stderr, err)
	}
	// A waiting run (the Wait stream) is refused the same way.
	wantNoPerm(t, dlockAs(t, store, toks["worker"], "run", "--wait", "settle:2", "--", "true"), toks, "lock")

	// status, list, fence check: read.
	wantCode(t, dlockAs(t, store, toks["viewer"], "status", "payout:1"), 0)
	wantNoPerm(t, dlockAs(t, store, toks["worker"], "status", "payout:1"), toks, "read")
	wantNoPerm(t, dlockAs(t, store, toks["viewer"], "status", "settle:1"), toks, "read", `"settle:1"`)
	wantCode(t, dlockAs(t, store, toks["viewer"], "list", "payout:"), 0)
	wantNoPerm(t, dlockAs(t, store, toks["viewer"], "list", "settle:"), toks, "read")
	if r := dlockAs(t, store, toks["viewer"], "fence", "check", "payout:1", "1"); r.code == 77 || r.code == 69 {
		t.Fatalf("viewer's fence check: exit %d %s", r.code, r.stderr)
	}
	wantNoPerm(t, dlockAs(t, store, toks["worker"], "fence", "check", "payout:1", "1"), toks, "read")

	// release --force: admin.
	wantNoPerm(t, dlockAs(t, store, toks["viewer"], "release", "--force", "--reason", "test", "payout:1"), toks, "admin")
	// cluster status over HTTP: read on "".
	wantNoPerm(t, dlockAs(t, store, toks["viewer"], "cluster", "status"), toks, "read")
	wantNoPerm(t, dlockAs(t, store, "", "cluster", "status"), toks)
	wantCode(t, dlockAs(t, store, toks["ops"], "cluster", "status"), 0)
	wantNoPerm(t, dlockAs(t, store, toks["worker"], "cluster", "transfer-leader"), toks, "worker")
}

// TestAuth_SIGHUPRevokesToken: a token removed from the auth file is
// refused (exit 77) after dlockd gets SIGHUP; a broken file sent with
// SIGHUP keeps the rules in force; both reloads are in the audit log.
func TestAuth_SIGHUPRevokesToken(t *testing.T) {
	p, toks, authFile, audit := authDlockd(t)
	store := "dlockd://" + p.Addr()
	wantCode(t, dlockAs(t, store, toks["worker"], "run", "payout:1", "--", "true"), 0)

	// A broken file: the rules stay.
	if err := os.WriteFile(authFile, []byte("identities: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	awaitAudit(t, audit, `"result":"failed"`)
	wantCode(t, dlockAs(t, store, toks["worker"], "run", "payout:2", "--", "true"), 0)

	// Without worker: revoked.
	servertest.WriteAuthFile(t, filepath.Dir(authFile), []servertest.Identity{
		{Name: "ops", Token: toks["ops"], Rules: map[string][]string{"": {"admin", "lock"}}},
	})
	if err := syscall.Kill(p.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	awaitAudit(t, audit, `"action":"auth-reload","key":"","reason":"1 identities","result":"ok"`)
	wantNoPerm(t, dlockAs(t, store, toks["worker"], "run", "payout:3", "--", "true"), toks, "unknown token")
	wantCode(t, dlockAs(t, store, toks["ops"], "run", "payout:3", "--", "true"), 0)
	// The process is still the same one: SIGHUP did not stop it.
	if p.PID() == 0 {
		t.Fatal("dlockd exited on SIGHUP")
	}
	// No token text in dlockd's log or the audit log.
	logText, _ := os.ReadFile(p.Log.Name())
	auditText, _ := os.ReadFile(audit)
	if !strings.Contains(string(logText), "auth file not reloaded") {
		t.Fatalf("dlockd's log does not say the broken file was not reloaded:\n%s", logText)
	}
	for name, tok := range toks {
		if strings.Contains(string(logText), tok) || strings.Contains(string(auditText), tok) {
			t.Fatalf("a log holds %s's token", name)
		}
	}
}

// TestToken_NewEntryWorks: "dlock token new" prints a token and an auth
// file entry; a dlockd started with that entry accepts the token within
// the entry's rules; "dlock token hash" prints the same hash.
func TestToken_NewEntryWorks(t *testing.T) {
	dir := t.TempDir()
	tf := filepath.Join(dir, "worker.token")
	r := dlock(t, "mem://", "token", "new", "payout-worker", "--rule", "payout:=lock", "--token-file", tf, "-o", "json")
	wantCode(t, r, 0)
	var e struct {
		Name        string `json:"name"`
		Token       string `json:"token"`
		TokenSHA256 string `json:"token_sha256"`
		Entry       string `json:"entry"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
		t.Fatalf("token new -o json: %q: %v", r.stdout, err)
	}
	if strings.Contains(r.stdout, "dlk_") {
		t.Fatalf("token new --token-file printed the token: %s", r.stdout)
	}
	st, err := os.Stat(tf)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", st, err)
	}
	// token hash agrees.
	cmd := command("mem://", "token", "hash")
	f, err := os.Open(tf)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdin = f
	h := runCmd(t, cmd)
	wantCode(t, h, 0)
	if strings.TrimSpace(h.stdout) != e.TokenSHA256 || len(e.TokenSHA256) != 64 {
		t.Fatalf("token hash %q, token new's hash %q", h.stdout, e.TokenSHA256)
	}
	// A second token new to the same file refuses to overwrite it.
	wantCode(t, dlock(t, "mem://", "token", "new", "x", "--token-file", tf), 1)

	authFile := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(authFile, []byte("identities:\n"+e.Entry), 0o600); err != nil {
		t.Fatal(err)
	}
	p := servertest.StartProcess(t, "--auth-file", authFile)
	store := "dlockd://" + p.Addr() + "?token_file=" + tf
	wantCode(t, dlock(t, store, "run", "payout:1", "--", "true"), 0)
	r = dlock(t, store, "run", "settle:1", "--", "true")
	wantCode(t, r, 77)
	if !strings.Contains(r.stderr, "payout-worker") || !strings.Contains(r.stderr, `"settle:1"`) {
		t.Fatalf("denial %q: want the identity's name and the key", r.stderr)
	}
}

// awaitAudit waits up to 5s for the audit log to contain want.
func awaitAudit(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit log %s lacks %s:\n%s", path, want, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
