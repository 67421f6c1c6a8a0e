package testservers

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// DynaliteVersion is the dynalite release scripts/test-deps/dynamodb.sh
// installs (npm package dynalite, pinned).
const DynaliteVersion = "4.0.0"

// dynaliteInstallHint is shown when node or dynalite is missing.
const dynaliteInstallHint = "run make test-deps (or scripts/test-deps/dynamodb.sh, which installs Debian's nodejs and npm, then " +
	"npm install --prefix ${DLOCK_TEST_CACHE:-$HOME/.cache/dlock-test}/npm/dynalite dynalite@" + DynaliteVersion + ")"

// Dynalite's development credentials: any key is accepted; the tests use
// these fixed ones.
const (
	DynaliteAccessKey = "dlocktest"
	DynaliteSecretKey = "dlocktest-secret"
	DynaliteRegion    = "us-east-1"
)

// Dynalite is a dynalite process (an implementation of DynamoDB's API on
// LevelDB, by the architect project) started by a test: listening on
// 127.0.0.1 on a port chosen once, its tables in a LevelDB directory of
// t.TempDir(), so Stop and Start bring it back on the same port with the
// same data. It is an emulator: it keeps DynamoDB's API and conditional
// writes, not its latency, capacity limits or TTL deletions. All methods
// are safe for concurrent use.
type Dynalite struct {
	node string
	cli  string
	port int
	dir  string
	log  string
	// keepUp is a script node loads first (see dynaliteKeepUp).
	keepUp string

	mu   sync.Mutex
	proc *Process
}

// dynaliteKeepUp is loaded into dynalite's node process (node -r): dynalite
// throws from a request's error handler when a client goes away in the
// middle of a request (index.js: req.on('error', ... throw err)), which
// ends the whole server; a test that cuts a link or gives up on a call
// then took every later test of the package down with it (seen in CI:
// "Error: aborted", ECONNRESET). Such an error is logged and the server
// goes on; any other uncaught error still ends it.
const dynaliteKeepUp = `process.on('uncaughtException', function (err) {
  if (err && (err.code === 'ECONNRESET' || err.message === 'aborted')) {
    console.error('dlock tests: a client went away mid-request:', err.message)
    return
  }
  console.error(err)
  process.exit(1)
})
`

// DynaliteCLI returns the path of dynalite's cli.js in the test cache
// (DLOCK_TEST_CACHE, default ~/.cache/dlock-test), where
// scripts/test-deps/dynamodb.sh installs it.
func DynaliteCLI() string {
	cache := os.Getenv("DLOCK_TEST_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "dlock-test")
	}
	return filepath.Join(cache, "npm", "dynalite", "node_modules", "dynalite", "cli.js")
}

// StartDynalite starts dynalite for t and waits until it answers a
// ListTables request. It fails the test with the install command when node
// or dynalite is missing. The server is stopped by PID in t.Cleanup; its
// log is printed when the test failed.
func StartDynalite(t TB) *Dynalite {
	t.Helper()
	node := Binary(t, "node", dynaliteInstallHint, "/usr/bin", "/usr/local/bin")
	cli := DynaliteCLI()
	if _, err := os.Stat(cli); err != nil {
		t.Fatalf("testservers: dynalite not found at %s; install it: %s", cli, dynaliteInstallHint)
	}
	dir := t.TempDir()
	d := &Dynalite{
		node: node, cli: cli,
		port:   FreePort(t),
		dir:    filepath.Join(dir, "leveldb"),
		log:    filepath.Join(dir, "dynalite.log"),
		keepUp: filepath.Join(dir, "keepup.js"),
	}
	if err := os.WriteFile(d.keepUp, []byte(dynaliteKeepUp), 0o600); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	t.Cleanup(func() {
		d.Kill()
		logTailOnFailure(t, "dynalite "+d.Addr(), d.log)
	})
	if err := d.Start(); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	return d
}

// Addr returns "127.0.0.1:port".
func (d *Dynalite) Addr() string { return fmt.Sprintf("127.0.0.1:%d", d.port) }

// Endpoint returns the HTTP endpoint, "http://127.0.0.1:port".
func (d *Dynalite) Endpoint() string { return "http://" + d.Addr() }

// URL returns the dlock store URL of table on this server:
// "dynamodb://TABLE?region=us-east-1&endpoint=http://127.0.0.1:port".
func (d *Dynalite) URL(table string) string {
	return "dynamodb://" + table + "?region=" + DynaliteRegion + "&endpoint=" + d.Endpoint()
}

// PID returns the process id of the running server, or 0 when it is stopped.
func (d *Dynalite) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return 0
	}
	select {
	case <-d.proc.Exited():
		return 0
	default:
	}
	return d.proc.PID()
}

// Start starts the server when it is stopped, on the same port with the
// same LevelDB directory, and waits until it answers. Starting a running
// server is a no-op. It returns an error (with the log's tail) when the
// server does not come up.
func (d *Dynalite) Start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil {
		select {
		case <-d.proc.Exited():
		default:
			return nil
		}
	}
	cmd := exec.Command(d.node, "-r", d.keepUp, d.cli,
		"--host", "127.0.0.1",
		"--port", Itoa(d.port),
		"--path", d.dir,
		// Tables become ACTIVE at once (the default keeps them CREATING
		// for 500 ms, as DynamoDB does for longer).
		"--createTableMs", "0",
		"--deleteTableMs", "0",
		"--updateTableMs", "0",
	)
	p, err := StartProcess(cmd, d.log)
	if err != nil {
		return fmt.Errorf("start dynalite on %s: %w", d.Addr(), err)
	}
	d.proc = p
	if err := waitDynalite(d.Endpoint(), p, 20*time.Second); err != nil {
		p.Kill()
		b, _ := os.ReadFile(d.log)
		return fmt.Errorf("dynalite on %s: %w\n%s", d.Addr(), err, logTail(string(b), 2000))
	}
	return nil
}

// Stop shuts the server down (SIGTERM; SIGKILL after 5 s) and waits for it
// to exit. The port and the data are kept for Start. Stopping a stopped
// server is a no-op; the error is always nil (it fits
// dlocktest.Harness.StopStore).
func (d *Dynalite) Stop() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil {
		d.proc.Stop(5 * time.Second)
	}
	return nil
}

// Kill stops the server with SIGKILL. Start brings it back.
func (d *Dynalite) Kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil {
		d.proc.Kill()
	}
}

// waitDynalite waits until the server answers a ListTables request (any
// DynamoDB JSON answer counts: it is up and parsing requests).
func waitDynalite(endpoint string, p *Process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: 500 * time.Millisecond}
	defer c.CloseIdleConnections()
	var last error
	for {
		select {
		case <-p.Exited():
			return fmt.Errorf("exited while starting (%v)", p.Cmd.ProcessState)
		default:
		}
		req, _ := http.NewRequest(http.MethodPost, endpoint, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
		req.Header.Set("X-Amz-Target", "DynamoDB_20120810.ListTables")
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+DynaliteAccessKey+"/20000101/"+DynaliteRegion+"/dynamodb/aws4_request, SignedHeaders=host, Signature=0")
		req.Header.Set("X-Amz-Date", "20000101T000000Z")
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("ListTables answered %s", resp.Status)
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dynaliteEnv is the environment SetDynaliteEnv and UseDynaliteEnv set;
// an empty value unsets (the SDK treats an empty variable as unset).
func dynaliteEnv() map[string]string {
	return map[string]string{
		"AWS_ACCESS_KEY_ID":                      DynaliteAccessKey,
		"AWS_SECRET_ACCESS_KEY":                  DynaliteSecretKey,
		"AWS_REGION":                             DynaliteRegion,
		"AWS_EC2_METADATA_DISABLED":              "true",
		"AWS_CONFIG_FILE":                        os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE":            os.DevNull,
		"AWS_PROFILE":                            "",
		"AWS_DEFAULT_PROFILE":                    "",
		"AWS_SESSION_TOKEN":                      "",
		"AWS_ROLE_ARN":                           "",
		"AWS_WEB_IDENTITY_TOKEN_FILE":            "",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI":     "",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
	}
}

// SetDynaliteEnv points the AWS SDK's default configuration at dynalite's
// development credentials (DynaliteAccessKey, DynaliteSecretKey) and
// region, and away from anything of the machine's: no shared config or
// credentials files, no profile, no instance metadata (the chain never
// reaches for a network address beyond the emulator). For TestMain, before
// any test runs: it sets the process environment for good.
func SetDynaliteEnv() {
	for k, v := range dynaliteEnv() {
		if v == "" {
			_ = os.Unsetenv(k)
		} else {
			_ = os.Setenv(k, v)
		}
	}
}

// UseDynaliteEnv is SetDynaliteEnv for the duration of t (t.Setenv: not
// in parallel tests).
func UseDynaliteEnv(t TB) {
	t.Helper()
	for k, v := range dynaliteEnv() {
		t.Setenv(k, v)
	}
}
