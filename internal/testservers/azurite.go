package testservers

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// AzuriteVersion is the version of the npm package azurite that
// scripts/test-deps/azblob.sh installs.
const AzuriteVersion = "3.37.0"

// AzuriteAccount is the emulator's well-known development account. Its key
// is published in Microsoft's Azurite documentation; drivers/azblobdriver
// uses it with auth=emulator.
const AzuriteAccount = "devstoreaccount1"

// azuriteInstallHint is shown when azurite-blob is missing.
const azuriteInstallHint = "run make test-deps, or scripts/test-deps/azblob.sh (npm install --prefix " +
	"${DLOCK_TEST_CACHE:-$HOME/.cache/dlock-test}/npm/azurite azurite@" + AzuriteVersion +
	"; Debian's nodejs and npm first)"

// azuriteReadyTimeout bounds how long Start waits for the blob service to
// answer HTTP.
const azuriteReadyTimeout = 60 * time.Second

// Azurite is the blob service of Azurite, the Azure Storage emulator (npm
// package azurite, run as azurite-blob), started by a test: listening on
// 127.0.0.1 on a port chosen once, with its data (LokiJS metadata, saved to
// disk every 5 s and on a graceful stop, and the blob extents) in a
// directory of t.TempDir(). Stop and Start take it down and bring it back on
// the same port with the same data. All methods are safe for concurrent
// use.
type Azurite struct {
	bin  string
	port int
	dir  string
	log  string

	mu   sync.Mutex
	proc *Process
}

// AzuriteBinary returns the path of azurite-blob: $AZURITE_BLOB when set,
// else the test cache that scripts/test-deps/azblob.sh installs into
// (${DLOCK_TEST_CACHE:-$HOME/.cache/dlock-test}/npm/azurite), else PATH. It
// fails the test with the install command when none exists.
func AzuriteBinary(t TB) string {
	t.Helper()
	if p := os.Getenv("AZURITE_BLOB"); p != "" {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
		t.Fatalf("testservers: AZURITE_BLOB=%s does not exist; unset it or %s", p, azuriteInstallHint)
	}
	cache := os.Getenv("DLOCK_TEST_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "dlock-test")
	}
	return Binary(t, "azurite-blob", azuriteInstallHint, filepath.Join(cache, "npm", "azurite", "node_modules", ".bin"))
}

// StartAzurite starts Azurite's blob service for t and waits until it
// answers HTTP. It fails the test when azurite-blob (or node) is missing,
// with the command that installs it, or when it does not start. The server
// is stopped by PID in t.Cleanup; its log is printed when the test failed.
func StartAzurite(t TB) *Azurite {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("testservers: node not found (Azurite runs on Node.js): %s", azuriteInstallHint)
	}
	a := &Azurite{bin: AzuriteBinary(t), port: FreePort(t), dir: t.TempDir()}
	a.log = filepath.Join(a.dir, "azurite.log")
	t.Cleanup(func() {
		a.Kill()
		if t.Failed() {
			if b, err := os.ReadFile(a.log); err == nil && len(b) > 0 {
				t.Logf("azurite-blob %s log:\n%s", a.Addr(), logTail(string(b), 4000))
			}
		}
	})
	if err := a.Start(); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	return a
}

// Addr returns "127.0.0.1:port".
func (a *Azurite) Addr() string { return fmt.Sprintf("127.0.0.1:%d", a.port) }

// Endpoint returns the blob service URL of the development account,
// "http://127.0.0.1:port/devstoreaccount1" (Azurite's path-style URL: the
// account is the first path segment).
func (a *Azurite) Endpoint() string { return "http://" + a.Addr() + "/" + AzuriteAccount }

// URL returns the azblob:// store URL of container on this server, with the
// emulator's development credentials:
// "azblob://devstoreaccount1/CONTAINER?auth=emulator&endpoint=http%3A%2F%2F127.0.0.1%3Aport%2Fdevstoreaccount1".
func (a *Azurite) URL(container string) string {
	return AzuriteURL(a.Addr(), container)
}

// AzuriteURL is Azurite.URL for an Azurite (or a proxy in front of one) at
// addr ("127.0.0.1:port").
func AzuriteURL(addr, container string) string {
	q := url.Values{"endpoint": {"http://" + addr + "/" + AzuriteAccount}, "auth": {"emulator"}}
	return "azblob://" + AzuriteAccount + "/" + container + "?" + q.Encode()
}

// Port returns the TCP port.
func (a *Azurite) Port() int { return a.port }

// Dir returns the data directory.
func (a *Azurite) Dir() string { return a.dir }

// PID returns the process id of the running server (node), or 0 when it is
// stopped.
func (a *Azurite) PID() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc == nil {
		return 0
	}
	select {
	case <-a.proc.Exited():
		return 0
	default:
	}
	return a.proc.PID()
}

// Start starts the server when it is stopped, on the same port with the same
// data directory, and waits until it answers HTTP. Starting a running
// server is a no-op. It returns an error (with the log's tail) when the
// server does not come up.
func (a *Azurite) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil {
		select {
		case <-a.proc.Exited():
		default:
			return nil
		}
	}
	args := []string{
		"--blobHost", "127.0.0.1",
		"--blobPort", Itoa(a.port),
		"--location", a.dir,
		"--silent",
		"--skipApiVersionCheck", // the SDK may be newer than the emulator's API version
		"--loose",               // ignore headers the emulator does not support
		"--disableTelemetry",    // no outbound traffic
	}
	cmd := exec.Command(a.bin, args...)
	cmd.Dir = a.dir
	p, err := StartProcess(cmd, a.log)
	if err != nil {
		return fmt.Errorf("start azurite-blob on %s: %w", a.Addr(), err)
	}
	a.proc = p
	if err := waitHTTP("http://"+a.Addr()+"/"+AzuriteAccount+"?comp=list", p, azuriteReadyTimeout); err != nil {
		p.Kill()
		b, _ := os.ReadFile(a.log)
		return fmt.Errorf("azurite-blob on %s: %w\n%s", a.Addr(), err, logTail(string(b), 2000))
	}
	return nil
}

// Stop shuts the server down gracefully (SIGTERM: Azurite saves its
// metadata database before it exits; SIGKILL after 10 s) and waits for it
// to exit. The port and the data directory are kept for Start. Stopping a
// stopped server is a no-op; the error is always nil (it fits
// dlocktest.Harness.StopStore).
func (a *Azurite) Stop() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil {
		a.proc.Stop(10 * time.Second)
	}
	return nil
}

// Kill stops the server with SIGKILL, as a crash would: metadata changes of
// the last 5 s that Azurite had not saved yet are lost (an emulator's
// weakness, not the service's). Start brings it back.
func (a *Azurite) Kill() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil {
		a.proc.Kill()
	}
}

// waitHTTP waits until url answers any HTTP response (the emulator refuses
// an unauthenticated request with 403: it is up).
func waitHTTP(u string, p *Process, timeout time.Duration) error {
	client := &http.Client{
		Timeout:   time.Second,
		Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: 200 * time.Millisecond}).DialContext, DisableKeepAlives: true},
	}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.Exited():
			return fmt.Errorf("exited while starting (%v)", p.Cmd.ProcessState)
		default:
		}
		resp, err := client.Get(u)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %w", timeout, last)
}
