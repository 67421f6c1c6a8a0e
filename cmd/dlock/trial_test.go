package main_test

// Black-box tests of a newcomer's trial of the dlock CLI (issue 13, helper
// findings F1-F14): fail-open under every retry flag, a tiny --wait-timeout,
// the failed-release bound after a store restart, inspection commands that
// ride out a dlockd election, the run report contract on usage errors,
// completion and display of hostile keys, messages that name their source,
// a quiet --conflict-exit-code 0, and permit slots seen from status.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server/servertest"
)

// deadStore returns a store URL of scheme on a loopback port nothing
// listens on.
func deadStore(t *testing.T, scheme string) string {
	return fmt.Sprintf("%s://127.0.0.1:%d", scheme, testservers.FreePort(t))
}

// F1: --fail-open applies whenever the outcome would be 69, whatever
// --wait, --wait-timeout and --retry-for say; never to 64 or 75.
func TestTrial_FailOpenUnderEveryWaitFlag(t *testing.T) {
	dead := deadStore(t, "dlockd")
	for _, flags := range [][]string{
		{"--wait-timeout", "1s"},
		{"--wait", "--retry-for", "1s"},
		{"--wait", "--wait-timeout", "1s", "--retry-for", "500ms"},
		{"--retry-for", "500ms"},
		{"--wait-timeout", "1ms"},
	} {
		args := append(append([]string{"run"}, flags...), "--fail-open", "wk", "--", "echo", "RAN")
		res := dlock(t, dead, args...)
		if res.code != 0 || strings.TrimSpace(res.stdout) != "RAN" || !strings.Contains(res.stderr, "WITHOUT a lock") {
			t.Fatalf("dlock %v with the store down: exit %d, stdout %q, stderr %q; want it to run without a lock", args, res.code, res.stdout, res.stderr)
		}
		args = append(append([]string{"run"}, flags...), "wk", "--", "echo", "RAN")
		res = dlock(t, dead, args...)
		wantCode(t, res, 69)
		if res.stdout != "" {
			t.Fatalf("dlock %v without --fail-open ran: %q", args, res.stdout)
		}
	}
	// Invalid input is 64 with every flag, and held is 75: never fail open.
	wantCode(t, dlock(t, dead, "run", "--wait-timeout", "1s", "--fail-open", "--ttl", "10ms", "wk", "--", "echo", "RAN"), 64)
	store := testservers.StartRedis(t).URL()
	startHolder(t, store, "fo:held")
	res := dlock(t, store, "run", "--wait-timeout", "300ms", "--fail-open", "fo:held", "--", "echo", "RAN")
	wantCode(t, res, 75)
	if res.stdout != "" {
		t.Fatalf("a held key ran with --fail-open: %q", res.stdout)
	}
}

// F2: --wait-timeout makes one attempt whatever its length, and never says
// "held" unless the store did.
func TestTrial_TinyWaitTimeoutStillTries(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		for _, d := range []string{"1ns", "1ms"} {
			res := dlock(t, store, "run", "--wait-timeout", d, "tiny:free", "--", "echo", "ran")
			wantCode(t, res, 0)
			if strings.TrimSpace(res.stdout) != "ran" {
				t.Fatalf("--wait-timeout %s on a free key: stdout %q stderr %q", d, res.stdout, res.stderr)
			}
		}
		startHolder(t, store, "tiny:held", "--holder", "host-9")
		res := dlock(t, store, "run", "--wait-timeout", "1ms", "tiny:held", "--", "echo", "ran")
		wantCode(t, res, 75)
		if !strings.Contains(res.stderr, "held by host-9") {
			t.Fatalf("--wait-timeout 1ms on a held key: %q, want who holds it", res.stderr)
		}
	})
	res := dlock(t, deadStore(t, "dlockd"), "run", "--wait-timeout", "1ms", "tiny:down", "--", "echo", "ran")
	wantCode(t, res, 69)
	if strings.Contains(res.stderr, "held") || res.stdout != "" {
		t.Fatalf("store down, --wait-timeout 1ms: stdout %q stderr %q; must not claim the key is held", res.stdout, res.stderr)
	}
}

// F3: a release that failed because dlockd was down bounds the hold by the
// TTL after the store is back, and reports a plain cause.
func TestTrial_ReleaseFailureBoundAfterStoreBack(t *testing.T) {
	p := servertest.StartProcess(t)
	store := "dlockd://" + p.Addr()
	dir := t.TempDir()
	running, goOn, rep := filepath.Join(dir, "running"), filepath.Join(dir, "go"), filepath.Join(dir, "report.json")
	script := fmt.Sprintf(`touch %s; while [ ! -f %s ]; do sleep 0.02; done`, running, goOn)
	cmd := command(store, "run", "--ttl", "4s", "--retry-for", "0", "--report", rep, "relb:key", "--", "sh", "-c", script)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	awaitFile(t, running)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goOn, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dlock: %v, want the job's exit 0\nstderr: %s", err, errb.String())
	}
	stderr := errb.String()
	if !strings.Contains(stderr, "at most its TTL (4s) after the store is reachable again") || strings.Contains(stderr, "from now") {
		t.Fatalf("stderr %q: want the hold bounded by the TTL after the store is back", stderr)
	}
	var report map[string]any
	b, _ := os.ReadFile(rep)
	if err := json.Unmarshal(b, &report); err != nil {
		t.Fatalf("report %q: %v", b, err)
	}
	relErr, _ := report["release_error"].(string)
	if relErr == "" || strings.Contains(relErr, "rpc error") || strings.Contains(relErr, "desc =") || !strings.Contains(relErr, "cannot reach the store") {
		t.Fatalf("report %s: want a plain one-line release_error", b)
	}
	if d, _ := report["release_detail"].(string); d == "" {
		t.Fatalf("report %s: want the raw error in release_detail", b)
	}
	if report["key_held_up_to_seconds"] != 4.0 || report["key_held_from"] != "store_reachable_again" {
		t.Fatalf("report %s: want key_held_up_to_seconds 4 from store_reachable_again", b)
	}
	if _, ok := report["held_for_seconds"]; ok {
		t.Fatalf("report %s: held_for_seconds reads as how long the job held the lock", b)
	}
	res := dlock(t, "mem://", "run", "--help")
	if !strings.Contains(res.stdout, "key_held_up_to_seconds") {
		t.Fatal("run --help does not document key_held_up_to_seconds")
	}
}

// startDlockdElecting starts dlockd with a slow first election, so that it
// listens for a few seconds with no leader; it is killed at cleanup.
func startDlockdElecting(t *testing.T) string {
	t.Helper()
	addr, raft := servertest.FreePort(t), servertest.FreePort(t)
	cmd := exec.Command(servertest.Binary(t), "--listen", addr, "--data", filepath.Join(t.TempDir(), "data"), "--raft-bind", raft,
		"--raft-heartbeat-timeout", "4s", "--raft-election-timeout", "4s", "--raft-leader-lease-timeout", "500ms", "--log-level", "warn")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return "dlockd://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("dlockd never listened on %s", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// F4: status, list, release --force and fence check ride out a dlockd with
// no leader yet (--retry-for), and the hint follows the cause.
func TestTrial_InspectionRetriesWhileElecting(t *testing.T) {
	store := startDlockdElecting(t)
	res := dlock(t, store, "status", "--retry-for", "0", "el:key")
	wantCode(t, res, 69)
	if !strings.Contains(res.stderr, "no leader") || !strings.Contains(res.stderr, "starting or electing a leader") || strings.Contains(res.stderr, "is dlockd running") {
		t.Fatalf("status with no leader: %q, want the no-leader cause and its hint", res.stderr)
	}
	start := time.Now()
	res = dlock(t, store, "status", "--retry-for", "30s", "el:key")
	wantCode(t, res, 0)
	if strings.TrimSpace(res.stdout) != "el:key: free" {
		t.Fatalf("status after the election: %q", res.stdout)
	}
	t.Logf("status retried for %v", time.Since(start).Round(time.Millisecond))
	// Each of them has the flag and the environment variable.
	for _, args := range [][]string{
		{"list", "--retry-for", "2s"},
		{"fence", "check", "--retry-for", "2s", "el:key", "1"},
		{"release", "--force", "--retry-for", "2s", "el:key", "--reason", "x"},
	} {
		res := dlock(t, store, args...)
		if res.code == 64 || res.code == 69 {
			t.Fatalf("dlock %v: exit %d: %s", args, res.code, res.stderr)
		}
	}
	// Refused: the "is dlockd running" hint, after the default budget.
	dead := deadStore(t, "dlockd")
	cmd := command(dead, "list")
	cmd.Env = append(cmd.Env, "DLOCK_RETRY_FOR=600ms")
	start = time.Now()
	res = runCmd(t, cmd)
	wantCode(t, res, 69)
	if d := time.Since(start); d < 500*time.Millisecond || !strings.Contains(res.stderr, "is dlockd running at") || !strings.Contains(res.stderr, "retrying for") {
		t.Fatalf("list, store down, DLOCK_RETRY_FOR=600ms: after %v: %q", d, res.stderr)
	}
}

// F7: every exit of run -o json writes one one-line report; other commands'
// -o json errors are one JSON object on stdout, unknown ones included.
func TestTrial_JSONReportOnUsageErrors(t *testing.T) {
	dir := t.TempDir()
	type report struct {
		Key, Result, Code, Error string
		ExitCode                 int `json:"exit_code"`
	}
	oneReport := func(t *testing.T, what string, b []byte) report {
		t.Helper()
		var r report
		if bytes.Count(bytes.TrimSpace(b), []byte("\n")) != 0 || json.Unmarshal(b, &r) != nil || r.ExitCode != 64 || r.Code != "invalid_argument" || r.Error == "" {
			t.Fatalf("%s: report %q, want one JSON line with exit_code 64", what, b)
		}
		return r
	}
	for i, args := range [][]string{
		{"run", "--report", "FILE", "rp"},
		{"-o", "json", "run", "--report", "FILE", "rp", "ls", "-la"},
		{"run", "--bogus", "--report", "FILE", "rp", "--", "true"},
		{"run", "--report=FILE", "--ttl", "1ms", "rp", "--", "true"},
	} {
		rep := filepath.Join(dir, fmt.Sprintf("r%d.json", i))
		for j := range args {
			args[j] = strings.ReplaceAll(args[j], "FILE", rep)
		}
		res := dlock(t, "mem://", args...)
		wantCode(t, res, 64)
		b, err := os.ReadFile(rep)
		if err != nil {
			t.Fatalf("dlock %v wrote no report: %v", args, err)
		}
		oneReport(t, fmt.Sprint(args), b)
		if strings.Contains(res.stderr, "{") || res.stdout != "" {
			t.Fatalf("dlock %v: stdout %q stderr %q, want the report only in the file", args, res.stdout, res.stderr)
		}
	}
	for _, args := range [][]string{
		{"-o", "json", "run", "rp", "ls", "-la"},
		{"-o", "json", "run", "--bogus", "rp", "--", "true"},
		{"run", "-o", "json", "rp"},
		{"run", "--bogus", "-ojson", "rp", "--", "true"},
	} {
		res := dlock(t, "mem://", args...)
		wantCode(t, res, 64)
		lines := strings.Split(strings.TrimRight(res.stderr, "\n"), "\n")
		r := oneReport(t, fmt.Sprint(args), []byte(lines[len(lines)-1]))
		if n := strings.Count(res.stderr, "{"); n != 1 || res.stdout != "" {
			t.Fatalf("dlock %v: stderr %q, want exactly one report, as its last line; stdout %q", args, res.stderr, res.stdout)
		}
		if r.Result != "invalid" {
			t.Fatalf("dlock %v: result %q", args, r.Result)
		}
	}
	for _, args := range [][]string{
		{"-o", "json", "bogus"}, {"bogus", "-o", "json"}, {"-o", "json", "list", "--bogus"}, {"--output=json", "status"},
	} {
		res := dlock(t, "mem://", args...)
		wantCode(t, res, 64)
		var j struct {
			Error, Code string
			ExitCode    int `json:"exit_code"`
		}
		dec := json.NewDecoder(strings.NewReader(res.stdout))
		if err := dec.Decode(&j); err != nil || j.Code != "invalid_argument" || j.ExitCode != 64 || j.Error == "" || dec.More() {
			t.Fatalf("dlock %v: stdout %q (%v), want one JSON error object", args, res.stdout, err)
		}
	}
}

// F8: completion skips keys with control characters, which would split a
// candidate, reach the terminal or collide with cobra's tab separator.
func TestTrial_CompletionSkipsControlKeys(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	for _, k := range []string{"cc:plain", "cc:new\nline", "cc:esc\x1b[31m", "cc:tab\there", "cc:bidi\u202eevil"} {
		startHolder(t, store, k)
	}
	res := dlock(t, store, "__complete", "run", "cc:")
	wantCode(t, res, 0)
	var keys []string
	for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		if !strings.HasPrefix(line, ":") {
			keys = append(keys, strings.SplitN(line, "\t", 2)[0])
		}
	}
	if len(keys) != 1 || keys[0] != "cc:plain" || strings.Contains(res.stdout, "\x1b") || strings.Contains(res.stdout, "\u202e") {
		t.Fatalf("completion: candidates %q (stdout %q), want only cc:plain", keys, res.stdout)
	}
}

// F9: keys and holders with Unicode format characters are quoted; list's
// columns are padded by display width.
func TestTrial_FormatCharsQuotedAndWideKeysAligned(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		startHolder(t, store, "bidi:\u202egnp.exe", "--holder", "host\u200b-1")
		startHolder(t, store, "wide:日本語キー")
		startHolder(t, store, "wide:ascii")
		res := dlock(t, store, "list", "bidi:")
		wantCode(t, res, 0)
		if strings.Contains(res.stdout, "\u202e") || strings.Contains(res.stdout, "\u200b") || !strings.Contains(res.stdout, `"bidi:\u202egnp.exe"`) || !strings.Contains(res.stdout, `"host\u200b-1"`) {
			t.Fatalf("list with format characters: %q", res.stdout)
		}
		res = dlock(t, store, "status", "bidi:\u202egnp.exe")
		wantCode(t, res, 0)
		if strings.Contains(res.stdout, "\u202e") || strings.Contains(res.stdout, "\u200b") {
			t.Fatalf("status with format characters: %q", res.stdout)
		}
		res = dlock(t, store, "list", "wide:")
		wantCode(t, res, 0)
		lines := strings.Split(strings.TrimRight(res.stdout, "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("list wide: %q", res.stdout)
		}
		// The FENCE column starts at the same display column on every row.
		col := func(line, word string) int {
			i := strings.Index(line, word)
			if i < 0 {
				return -1
			}
			return displayCols(line[:i])
		}
		head := col(lines[0], "FENCE")
		for _, l := range lines[1:] {
			fields := strings.Fields(l)
			rest := strings.TrimPrefix(l, fields[0])
			at := displayCols(fields[0]) + len(rest) - len(strings.TrimLeft(rest, " "))
			if at != head {
				t.Fatalf("list wide: the FENCE column is at %d on %q, %d in the header\n%s", at, l, head, res.stdout)
			}
		}
	})
}

// displayCols counts terminal columns of s for the test: 2 for CJK and
// fullwidth runes, 1 for others.
func displayCols(s string) int {
	n := 0
	for _, r := range s {
		if r >= 0x1100 && (r <= 0x115f || (r >= 0x2e80 && r <= 0xa4cf) || (r >= 0xac00 && r <= 0xd7a3) || (r >= 0xf900 && r <= 0xfaff) || (r >= 0xff00 && r <= 0xff60) || (r >= 0xffe0 && r <= 0xffe6)) {
			n += 2
		} else {
			n++
		}
	}
	return n
}

// F11: messages name where a bad value came from and what is wrong with it.
func TestTrial_MessagesNameTheSource(t *testing.T) {
	dir := t.TempDir()
	conf := func(body string) string {
		p := filepath.Join(dir, fmt.Sprintf("c%d.yaml", len(body)))
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := conf("ttl: 0s\n")
	res := dlock(t, "mem://", "--config", p, "run", "k", "--", "true")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, p) || !strings.Contains(res.stderr, "ttl") || strings.Contains(res.stderr, "--ttl") {
		t.Fatalf("ttl: 0s in a config file: %q, want the file and key named", res.stderr)
	}
	p = conf("holder: " + strings.Repeat("h", 400) + "\n")
	res = dlock(t, "mem://", "--config", p, "run", "k", "--", "true")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, p+": holder") || strings.Contains(res.stderr, "--holder") {
		t.Fatalf("a 400-byte holder in a config file: %q, want the file and key named", res.stderr)
	}
	cmd := command("mem://", "run", "k", "--", "true")
	cmd.Env = append(cmd.Env, "DLOCK_TTL=0s")
	res = runCmd(t, cmd)
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "DLOCK_TTL") {
		t.Fatalf("DLOCK_TTL=0s: %q, want the variable named", res.stderr)
	}
	for _, body := range []string{"bogus: 1\n", "- a\n", "store: [a, b]\n"} {
		res = dlock(t, "mem://", "--config", conf(body), "list")
		wantCode(t, res, 64)
		if strings.Contains(res.stderr, "cli.") || strings.Contains(res.stderr, "fileConfig") || strings.Contains(res.stderr, "!!") || !strings.Contains(res.stderr, "configuration file") {
			t.Fatalf("config %q: %q, want plain words", body, res.stderr)
		}
	}

	res = dlock(t, "mem://", "release", "--force", "k", "--reason", "a\nb")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "U+000A") || strings.Contains(res.stderr, "1024 bytes") {
		t.Fatalf("--reason with a newline: %q, want the control character named", res.stderr)
	}

	res = dlock(t, "mem://", "run", "k", "--", "/nonexistent/cmd")
	wantCode(t, res, 127)
	time.Sleep(200 * time.Millisecond) // a late supervisor warning would come now
	if strings.TrimSpace(res.stderr) != "dlock: command not found: /nonexistent/cmd" {
		t.Fatalf("a missing command: stderr %q", res.stderr)
	}
}

// F12: --conflict-exit-code 0 is quiet on a conflict (cron mails stderr),
// unless --debug.
func TestTrial_ConflictExitCodeZeroIsQuiet(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	startHolder(t, store, "quiet:key")
	for _, flags := range [][]string{{}, {"--wait-timeout", "200ms"}, {"--permits", "1"}} {
		key := "quiet:key"
		if len(flags) > 0 && flags[0] == "--permits" {
			startPermitHolders(t, store, "quiet:sem", 1, 1)
			key = "quiet:sem"
		}
		args := append(append([]string{"run", "--conflict-exit-code", "0"}, flags...), key, "--", "echo", "ran")
		res := dlock(t, store, args...)
		wantCode(t, res, 0)
		if res.stderr != "" || res.stdout != "" {
			t.Fatalf("dlock %v: stdout %q stderr %q, want nothing", args, res.stdout, res.stderr)
		}
	}
	res := dlock(t, store, "run", "--debug", "--conflict-exit-code", "0", "quiet:key", "--", "echo", "ran")
	wantCode(t, res, 0)
	if !strings.Contains(res.stderr, "held by") {
		t.Fatalf("--debug: %q, want the conflict said", res.stderr)
	}
}

// F14: status of a free key says when its permit slots are held.
func TestTrial_StatusCountsHeldPermits(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		startPermitHolders(t, store, "sem", 3, 2)
		res := dlock(t, store, "status", "sem")
		wantCode(t, res, 0)
		if !strings.Contains(res.stdout, "free as a lock; 2 of its permit slots are held") {
			t.Fatalf("status sem: %q", res.stdout)
		}
		res = dlock(t, store, "-o", "json", "status", "sem")
		var j struct {
			Held        bool
			PermitsHeld int `json:"permits_held"`
		}
		if err := json.Unmarshal([]byte(res.stdout), &j); err != nil || j.Held || j.PermitsHeld != 2 {
			t.Fatalf("status -o json sem: %q (%v)", res.stdout, err)
		}
		res = dlock(t, store, "status", "other")
		if strings.TrimSpace(res.stdout) != "other: free" {
			t.Fatalf("status other: %q", res.stdout)
		}
	})
}

// startPermitHolders starts n holders of slots of the semaphore key with
// --permits permits, waits until n slots are listed as held, and stops them
// at cleanup.
func startPermitHolders(t *testing.T, store, key string, permits, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		cmd := command(store, "run", "--permits", fmt.Sprint(permits), key, "--", "sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := dlock(t, store, "list", key+"/permit-")
		if strings.Count(res.stdout, key+"/permit-") == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d permits of %s never held: %q", n, key, res.stdout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
