package testservers

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// postgresInstallHint is shown when the PostgreSQL server binaries are
// missing.
const postgresInstallHint = "apt-get install postgresql (make test installs it)"

// postgresReadyTimeout bounds how long StartPostgres and Postgres.Start wait
// for the server to accept connections (crash recovery included).
const postgresReadyTimeout = 30 * time.Second

// postgresBinDirs are where Debian and others put initdb and postgres, which
// are usually not on PATH.
var postgresBinDirs = []string{
	"/usr/lib/postgresql/*/bin",
	"/usr/local/pgsql/bin",
	"/usr/pgsql-*/bin",
	"/opt/homebrew/bin",
	"/usr/local/bin",
}

// Postgres is a PostgreSQL server process started by a test: listening on
// 127.0.0.1 on a port chosen once, its Unix socket and its data directory
// in a private temp dir, trust authentication for the superuser
// "postgres", default durability settings (fsync and synchronous_commit
// on). Stop and Start take it down and bring it back on the same port with
// the same data. All methods are safe for concurrent use.
//
// PostgreSQL refuses to run as root; when the test runs as root, initdb and
// postgres run as the "postgres" system user and the temp dir is handed to
// it.
type Postgres struct {
	bin  string // the postgres binary
	port int
	dir  string // private temp dir: data/, sock/, postgres.log
	cred *syscall.Credential

	mu   sync.Mutex
	proc *Process
}

// StartPostgres starts a PostgreSQL server for t and waits until it accepts
// connections. The cluster is copied from a template made once by initdb and
// cached in the system temp dir (keyed by the server version and the user it
// runs as), so a start costs a copy and a boot, not an initdb. It fails the
// test when the binaries are missing (with the command that installs them)
// or the server does not start. The server is stopped by PID and its dir
// removed in t.Cleanup; its log is printed when the test failed.
func StartPostgres(t TB) *Postgres {
	t.Helper()
	pgBin := Binary(t, "postgres", postgresInstallHint, postgresBinDirs...)
	initdb := filepath.Join(filepath.Dir(pgBin), "initdb")
	if _, err := os.Stat(initdb); err != nil {
		initdb = Binary(t, "initdb", postgresInstallHint, postgresBinDirs...)
	}
	cred, owner, err := postgresCredential()
	if err != nil {
		t.Fatalf("testservers: %v", err)
	}
	tmpl, err := postgresTemplate(pgBin, initdb, cred, owner)
	if err != nil {
		t.Fatalf("testservers: %v", err)
	}
	// Not t.TempDir: its parent is private to root, and the server user
	// must be able to reach the directory.
	dir, err := os.MkdirTemp("", "dlock-pg-")
	if err != nil {
		t.Fatalf("testservers: %v", err)
	}
	p := &Postgres{bin: pgBin, port: FreePort(t), dir: dir, cred: cred}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			if b, err := os.ReadFile(p.logPath()); err == nil {
				t.Logf("postgres %s log:\n%s", p.URL(), logTail(string(b), 4000))
			}
		}
		_ = os.RemoveAll(dir)
	})
	if out, err := exec.Command("cp", "-a", tmpl, p.dataDir()).CombinedOutput(); err != nil {
		t.Fatalf("testservers: copy the PostgreSQL template cluster: %v: %s", err, out)
	}
	if err := os.Mkdir(p.sockDir(), 0o700); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	if cred != nil {
		for _, d := range []string{dir, p.sockDir()} {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatalf("testservers: %v", err)
			}
		}
	}
	if err := p.Start(); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	return p
}

// URL returns "postgres://postgres@127.0.0.1:port/postgres?sslmode=disable".
func (p *Postgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Addr returns "127.0.0.1:port".
func (p *Postgres) Addr() string { return fmt.Sprintf("127.0.0.1:%d", p.port) }

// Port returns the TCP port.
func (p *Postgres) Port() int { return p.port }

// Dir returns the server's private temp dir (data/, sock/, postgres.log).
func (p *Postgres) Dir() string { return p.dir }

// PID returns the postmaster's process id, or 0 when it is stopped.
func (p *Postgres) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return 0
	}
	select {
	case <-p.proc.Exited():
		return 0
	default:
		return p.proc.PID()
	}
}

func (p *Postgres) dataDir() string { return filepath.Join(p.dir, "data") }
func (p *Postgres) sockDir() string { return filepath.Join(p.dir, "sock") }
func (p *Postgres) logPath() string { return filepath.Join(p.dir, "postgres.log") }

// Start starts the server when it is stopped, on the same port with the
// same data, and waits until it accepts connections. Starting a running
// server is a no-op. It returns an error (with the log's tail) when the
// server does not come up.
func (p *Postgres) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
		select {
		case <-p.proc.Exited():
		default:
			return nil
		}
	}
	cmd := exec.Command(p.bin,
		"-D", p.dataDir(),
		"-p", Itoa(p.port),
		"-k", p.sockDir(),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=200",
		"-c", "log_min_messages=warning",
		"-c", "log_line_prefix=%m [%p] ",
	)
	// postgres checks that it is not root before anything else, so the
	// credential is set on the process itself.
	attr := &syscall.SysProcAttr{Setpgid: true, Credential: p.cred}
	proc, err := startProcessAttr(cmd, p.logPath(), attr)
	if err != nil {
		return fmt.Errorf("start postgres on %s: %w", p.Addr(), err)
	}
	p.proc = proc
	if err := p.waitReady(proc, postgresReadyTimeout); err != nil {
		proc.Kill()
		b, _ := os.ReadFile(p.logPath())
		return fmt.Errorf("postgres on %s: %w\n%s", p.Addr(), err, logTail(string(b), 2000))
	}
	return nil
}

// Stop shuts the server down with a fast shutdown (SIGINT: clients are
// disconnected, a checkpoint is written; SIGKILL after 10 s) and waits for
// it to exit. The port and the data are kept for Start. Stopping a stopped
// server is a no-op; the error is always nil (it fits
// dlocktest.Harness.StopStore).
func (p *Postgres) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
		p.proc.signalThenKill(syscall.SIGINT, 10*time.Second)
	}
	return nil
}

// Kill stops the server at once, as a crash would (SIGQUIT, the immediate
// shutdown, then SIGKILL to the process group): Start runs crash recovery,
// which keeps every committed transaction (fsync is on).
func (p *Postgres) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
		p.proc.signalThenKill(syscall.SIGQUIT, 5*time.Second)
	}
}

// waitReady waits until postmaster.pid says "ready" and the port accepts
// TCP connections.
func (p *Postgres) waitReady(proc *Process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	pidFile := filepath.Join(p.dataDir(), "postmaster.pid")
	status := "no postmaster.pid yet"
	for time.Now().Before(deadline) {
		select {
		case <-proc.Exited():
			return fmt.Errorf("exited while starting (%v)", proc.Cmd.ProcessState)
		default:
		}
		if s, err := postmasterStatus(pidFile, proc.PID()); err == nil {
			status = s
			if s == "ready" {
				return WaitTCP(p.Addr(), time.Until(deadline))
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v (postmaster status: %s)", timeout, status)
}

// postmasterStatus reads the status line (the 8th) of postmaster.pid,
// written by PostgreSQL ≥ 10: "starting", "ready", "stopping" or "standby".
// It fails while the file belongs to another postmaster.
func postmasterStatus(path string, pid int) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, strings.TrimSpace(sc.Text()))
	}
	if len(lines) < 8 {
		return "", errors.New("postmaster.pid incomplete")
	}
	if lines[0] != strconv.Itoa(pid) {
		return "", fmt.Errorf("postmaster.pid names pid %s", lines[0])
	}
	return lines[7], nil
}

// postgresCredential returns the credential to run PostgreSQL with and the
// user name it stands for: the "postgres" system user when the test runs
// as root (nil credential otherwise: run as the current user).
func postgresCredential() (*syscall.Credential, string, error) {
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return nil, "", err
		}
		return nil, u.Username, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, "", fmt.Errorf("running as root, PostgreSQL must run as another user, but there is no \"postgres\" user (%v); %s", err, postgresInstallHint)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, "", fmt.Errorf("user postgres has uid %q gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, u.Username, nil
}

var postgresTemplateMu sync.Mutex

// postgresTemplate returns the path of a freshly initdb'd cluster to copy,
// making it when missing: initdb runs once per machine, server version and
// user (not once per test), and concurrent test binaries agree through an
// atomic rename.
func postgresTemplate(pgBin, initdb string, cred *syscall.Credential, owner string) (string, error) {
	postgresTemplateMu.Lock()
	defer postgresTemplateMu.Unlock()
	out, err := exec.Command(pgBin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", pgBin, err)
	}
	// "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)": keep "15.18".
	version := "unknown"
	if f := strings.Fields(string(out)); len(f) >= 3 {
		version = strings.Trim(f[2], "()")
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("dlock-pg-template-%s-%s", version, owner))
	if _, err := os.Stat(filepath.Join(path, "PG_VERSION")); err == nil {
		return path, nil
	}
	tmp, err := os.MkdirTemp("", "dlock-pg-initdb-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if cred != nil {
		if err := os.Chown(tmp, int(cred.Uid), int(cred.Gid)); err != nil {
			return "", err
		}
	}
	data := filepath.Join(tmp, "data")
	cmd := exec.Command(initdb,
		"-D", data,
		"-U", "postgres",
		"--auth=trust",
		"--encoding=UTF8",
		"--locale=C",
		"--no-sync", // the template is copied; the servers run with fsync on
	)
	cmd.Dir = tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %w: %s", err, logTail(string(out), 2000))
	}
	if err := os.Rename(data, path); err != nil {
		if _, statErr := os.Stat(filepath.Join(path, "PG_VERSION")); statErr == nil {
			return path, nil // another test binary made it first
		}
		return "", fmt.Errorf("install the PostgreSQL template cluster: %w", err)
	}
	return path, nil
}

// startProcessAttr is StartProcess with the caller's SysProcAttr (which
// must set Setpgid, so that the process group can be signalled).
func startProcessAttr(cmd *exec.Cmd, logPath string, attr *syscall.SysProcAttr) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = ChildAttr(attr)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// signalThenKill sends sig to the process (the leader only: PostgreSQL's
// postmaster shuts its children down itself), then SIGKILL to the process
// group after grace, and waits for the exit. A stopped process is left
// alone.
func (p *Process) signalThenKill(sig syscall.Signal, grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(p.PID(), sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
	}
}
