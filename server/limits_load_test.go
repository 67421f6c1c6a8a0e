package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestLoad_Limits measures one figure per limit against a dlockd process
// with its default flags: the server's peak RSS (and goroutines) under a
// load that each limit is there to bound. It runs only with DLOCKD_LOAD=1
// (about two minutes, a few hundred MB); DLOCKD_LOAD_BIN names another
// dlockd binary to measure (e.g. one built from before the limits), and
// DLOCKD_LOAD_ONLY a comma-separated list of scenarios. The figures are
// logged (go test -v).
func TestLoad_Limits(t *testing.T) {
	if os.Getenv("DLOCKD_LOAD") != "1" {
		t.Skip("set DLOCKD_LOAD=1 to measure the limits under load")
	}
	bin := os.Getenv("DLOCKD_LOAD_BIN")
	if bin == "" {
		bin = servertest.Binary(t)
	}
	only := os.Getenv("DLOCKD_LOAD_ONLY")
	for _, sc := range []struct {
		name string
		run  func(t *testing.T, p *loadProc) string
	}{
		{"session_pipelined", loadSessionPipelined},
		{"streams_one_connection", func(t *testing.T, p *loadProc) string { return loadWatchStreams(t, p, 1) }},
		{"watch_streams_20_connections", func(t *testing.T, p *loadProc) string { return loadWatchStreams(t, p, 20) }},
		{"connections", loadConnections},
		{"waiting_requests", loadWaiting},
		{"http_slow_bodies", loadSlowBodies},
	} {
		if only != "" && !strings.Contains(","+only+",", ","+sc.name+",") {
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			p := startLoadProc(t, bin)
			figure := sc.run(t, p)
			t.Logf("%s: %s; peak RSS %d MB (idle %d MB), %s goroutines at the end",
				sc.name, figure, p.peakRSS()>>20, p.idleRSS>>20, metric(t, p.addr, "go_goroutines"))
		})
	}
}

// loadProc is a dlockd subprocess whose RSS is sampled every 50ms.
type loadProc struct {
	addr    string
	pid     int
	idleRSS int64
	peak    atomic.Int64
}

func startLoadProc(t *testing.T, bin string) *loadProc {
	t.Helper()
	dir := t.TempDir()
	addr := servertest.FreePort(t)
	cmd := exec.Command(bin, "--listen", addr, "--data", filepath.Join(dir, "data"), "--raft-bind", servertest.FreePort(t),
		"--raft-heartbeat-timeout", "100ms", "--raft-election-timeout", "100ms", "--raft-leader-lease-timeout", "100ms",
		"--log-level", "warn", "--unsafe-no-fsync")
	logf, err := os.Create(filepath.Join(dir, "dlockd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p := &loadProc{addr: addr, pid: cmd.Process.Pid}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		<-sampled
		_ = cmd.Process.Kill()
		<-exited
		_ = logf.Close()
	})
	client := &http.Client{Timeout: time.Second}
	waitFor(t, func() bool {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	client.CloseIdleConnections()
	p.idleRSS = p.rss()
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if r := p.rss(); r > p.peak.Load() {
				p.peak.Store(r)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// rss returns the process's resident set size in bytes (0 once gone).
func (p *loadProc) rss() int64 { return procStatusKiB(p.pid, "VmRSS") << 10 }

// procStatusKiB returns a /proc/PID/status field given in kB (VmRSS, VmHWM),
// in KiB; 0 when the process is gone or has no such field.
func procStatusKiB(pid int, field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb
		}
	}
	return 0
}

func (p *loadProc) peakRSS() int64 { return max(p.peak.Load(), p.rss()) }

func loadDial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// loadSessionPipelined: 300k Renew calls pipelined on one Session stream
// before any answer is read, then every answer read.
func loadSessionPipelined(t *testing.T, p *loadProc) string {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := dlockv1.NewLockClient(loadDial(t, p.addr))
	const owner = "owner-load-0123456789"
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "load", Owner: owner, Ttl: durationpb.New(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	st, err := c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 300000
	var sent atomic.Int64
	sendDone := make(chan error, 1)
	go func() {
		for i := 1; i <= n; i++ {
			if err := st.Send(&dlockv1.SessionRequest{Id: uint64(i), Call: &dlockv1.SessionRequest_Renew{Renew: &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "load", Owner: owner}}}}}); err != nil {
				sendDone <- err
				return
			}
			sent.Add(1)
		}
		sendDone <- st.CloseSend()
	}()
	// Until the sender is done or stalled for 2s.
	last, still := int64(-1), 0
	for still < 40 {
		select {
		case err := <-sendDone:
			sendDone <- err
			still = 40
			continue
		case <-time.After(50 * time.Millisecond):
		}
		if s := sent.Load(); s == last {
			still++
		} else {
			last, still = s, 0
		}
	}
	stalledAt := sent.Load()
	stalledRSS := p.rss()
	goroutines := metric(t, p.addr, "go_goroutines")
	start := time.Now()
	for range n {
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-sendDone; err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("client sent %d of %d calls unanswered before it stalled (or finished); then RSS %d MB, %s goroutines; all %d answered %v after reading began",
		stalledAt, n, stalledRSS>>20, goroutines, n, time.Since(start).Round(time.Millisecond))
}

// loadWatchStreams: 20k Watch streams attempted at once over conns
// connections.
func loadWatchStreams(t *testing.T, p *loadProc, conns int) string {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	clients := make([]dlockv1.LockClient, conns)
	for i := range clients {
		cc, err := grpc.NewClient("passthrough:///"+p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		clients[i] = dlockv1.NewLockClient(cc)
	}
	const n = 20000
	var ready, refused, other atomic.Int64
	sctx, scancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := clients[i%conns].Watch(sctx, &dlockv1.WatchRequest{Session: fmt.Sprintf("session-%05d-0123456789", i)})
			if err == nil {
				_, err = w.Recv()
			}
			switch {
			case err == nil:
				ready.Add(1)
				<-sctx.Done()
			case status.Code(err) == codes.ResourceExhausted:
				refused.Add(1)
			default:
				other.Add(1)
			}
		}()
	}
	// Until no stream opens for 2s.
	last, still := int64(-1), 0
	for still < 40 && ready.Load()+refused.Load()+other.Load() < n {
		time.Sleep(50 * time.Millisecond)
		if r := ready.Load(); r == last {
			still++
		} else {
			last, still = r, 0
		}
	}
	openRSS := p.rss()
	goroutines := metric(t, p.addr, "go_goroutines")
	scancel()
	wg.Wait()
	return fmt.Sprintf("%d Watch streams attempted over %d connection(s): %d open at once (clients queue streams beyond a connection's cap), %d refused; RSS %d MB with them open, %s goroutines",
		n, conns, last, refused.Load(), openRSS>>20, goroutines)
}

// loadConnections: 12,000 connections opened (and left silent).
func loadConnections(t *testing.T, p *loadProc) string {
	const n = 12000
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	start := time.Now()
	for range n {
		c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	took := time.Since(start)
	rss := p.rss()
	opened := len(conns)
	for _, c := range conns {
		_ = c.Close()
	}
	conns = nil
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	waitFor(t, func() bool { // the slots free as the server notices the closes
		resp, err := client.Get("http://" + p.addr + "/healthz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return true
	})
	return fmt.Sprintf("%d connections opened in %v, %q closed at once by the server; RSS %d MB with them open",
		opened, took.Round(time.Millisecond), metric(t, p.addr, `dlockd_limit_refusals_total{limit="connections"}`), rss>>20)
}

// loadWaiting: 20,000 acquisitions with wait on 4 held keys, over 20
// connections.
func loadWaiting(t *testing.T, p *loadProc) string {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const conns, perConn, keys = 20, 1000, 4
	clients := make([]dlockv1.LockClient, conns)
	for i := range clients {
		clients[i] = dlockv1.NewLockClient(loadDial(t, p.addr))
	}
	for k := range keys {
		if _, err := clients[0].Acquire(ctx, &dlockv1.AcquireRequest{Key: fmt.Sprint("wait-", k), Ttl: durationpb.New(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	wctx, wcancel := context.WithCancel(ctx)
	var refused, ended atomic.Int64
	var wg sync.WaitGroup
	for i := range conns * perConn {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := clients[i%conns].Acquire(wctx, &dlockv1.AcquireRequest{Key: fmt.Sprint("wait-", i%keys), Wait: true})
			if status.Code(err) == codes.ResourceExhausted {
				refused.Add(1)
			}
			ended.Add(1)
		}()
	}
	var waiters string
	waitFor(t, func() bool {
		w := metric(t, p.addr, "dlockd_waiters")
		n, _ := strconv.Atoi(w)
		done := n+int(refused.Load()) >= conns*perConn
		if done {
			waiters = w
		}
		return done
	})
	rss := p.rss()
	goroutines := metric(t, p.addr, "go_goroutines")
	wcancel()
	wg.Wait()
	return fmt.Sprintf("%d acquisitions with wait attempted: %s queued, %d refused; RSS %d MB, %s goroutines",
		conns*perConn, waiters, refused.Load(), rss>>20, goroutines)
}

// loadSlowBodies: 1,000 HTTP requests whose bodies trickle one byte per
// second.
func loadSlowBodies(t *testing.T, p *loadProc) string {
	const n = 1000
	body := `{"key":"slow","ttl":"30s"}`
	var answered atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() { // the trickle
			defer wg.Done()
			_, _ = fmt.Fprintf(c, "POST /v1/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", len(body))
			for i := range len(body) {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				if _, err := c.Write([]byte{body[i]}); err != nil {
					return
				}
			}
		}()
		go func() { // the answer
			defer wg.Done()
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				answered.Add(1)
			}
		}()
	}
	start := time.Now()
	time.Sleep(12 * time.Second) // the default body timeout is 10s
	got := answered.Load()
	rss := p.rss()
	close(stop)
	wg.Wait()
	return fmt.Sprintf("%d requests trickling their bodies: %d answered within %v; RSS %d MB", n, got, time.Since(start).Round(time.Second), rss>>20)
}
