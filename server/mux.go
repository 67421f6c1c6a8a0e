package server

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// connMux splits one listener in two by the first bytes of each connection:
// an HTTP/2 client preface ("PRI * HTTP/2.0", what every gRPC client sends
// on a plaintext connection) goes to the gRPC server, served natively by
// grpc-go; anything else (HTTP/1.x: curl, browsers, Prometheus) goes to the
// HTTP server. JSON over h2c prior knowledge is therefore not served.
// When the API serves TLS (tls.go), each connection's TLS handshake runs
// first, in route, and the decrypted bytes are sniffed the same way; ALPN
// gives HTTP/1.1 to clients that offer it (browsers, curl) and h2 to
// those that offer only h2 (gRPC), so JSON over TLS with h2 only is not
// served either.
//
// It is the front door: it caps the open connections at
// Config.MaxConnections, and those of one source IP address at
// Config.MaxConnectionsPerIP (one more is closed at once and counted, limit
// "connections" or "connections_per_ip"), so that one source cannot hold
// every slot (idle sockets kept open through the handshake window, say);
// it counts its refusals in the node's limits (see limits.go). An Accept error other
// than a closed listener (EMFILE, ENFILE, ECONNABORTED, ...) is logged and
// retried after a pause of 5ms doubling to 1s, as net/http does, so that
// running out of file descriptors never closes the API port for good.
type connMux struct {
	root net.Listener
	grpc *chanListener
	http *chanListener
	lim  *limits
	// tls, when set, is the API's TLS configuration (tls.go): each
	// connection's handshake runs first, in its own goroutine and within
	// the connection cap, and the decrypted bytes are sniffed.
	tls *tls.Config
	// handshakeFailed, when set, counts and logs a failed TLS handshake
	// and returns its reason (Server.tlsHandshakeFailed).
	handshakeFailed func(remote net.Addr, err error) string

	log      *slog.Logger
	maxConns int64        // 0: no cap
	conns    atomic.Int64 // open connections, counted from Accept to Close
	maxPerIP int64        // 0: no cap
	ipMu     sync.Mutex
	perIP    map[string]int64 // open connections by source IP address

	wg        sync.WaitGroup
	closeOnce sync.Once
	done      chan struct{}
}

// listenerHook, when set, wraps the API listener of every server started
// afterwards. It exists for tests only, which inject Accept faults; it is
// nil in production.
var listenerHook atomic.Pointer[func(net.Listener) net.Listener]

// newConnMux splits root, capping its connections at maxConns (0: no cap)
// and counting refusals in lim.
func newConnMux(root net.Listener, lim *limits, log *slog.Logger, maxConns int) *connMux {
	if h := listenerHook.Load(); h != nil {
		root = (*h)(root)
	}
	done := make(chan struct{})
	return &connMux{
		root:     root,
		grpc:     &chanListener{addr: root.Addr(), ch: make(chan net.Conn), done: done},
		http:     &chanListener{addr: root.Addr(), ch: make(chan net.Conn), done: done},
		lim:      lim,
		log:      log,
		maxConns: int64(maxConns),
		done:     done,
	}
}

// Accept retry pauses: the first, and the longest.
const (
	acceptDelayMin = 5 * time.Millisecond
	acceptDelayMax = time.Second
)

// serve accepts until the root listener is closed, then waits for the
// connections being sorted.
func (m *connMux) serve() {
	defer m.wg.Wait()
	var delay time.Duration
	var lastLog time.Time
	suppressed := 0
	for {
		c, err := m.root.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || m.closed() {
				m.close()
				return
			}
			// EMFILE and friends: the listener is fine, the process is
			// out of something for a moment. Pause and retry; the kernel
			// keeps the pending connections in the backlog meanwhile.
			delay = min(max(2*delay, acceptDelayMin), acceptDelayMax)
			if now := time.Now(); now.Sub(lastLog) >= logEvery {
				m.log.Warn("dlockd: accept failed; retrying", "err", err, "retry_in", delay, "suppressed", suppressed)
				lastLog, suppressed = now, 0
			} else {
				suppressed++
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-m.done:
				t.Stop()
				return
			}
			continue
		}
		delay = 0
		if n := m.conns.Add(1); m.maxConns > 0 && n > m.maxConns {
			m.conns.Add(-1)
			_ = c.Close()
			m.lim.refused(limitConnections, fmt.Sprintf("connection from %s closed: %d connections open (limit %d)", c.RemoteAddr(), n-1, m.maxConns))
			continue
		}
		ip := sourceIP(c.RemoteAddr())
		if n, ok := m.takeIP(ip); !ok {
			m.conns.Add(-1)
			_ = c.Close()
			m.lim.refused(limitConnectionsIP, fmt.Sprintf("connection from %s closed: %d connections open from %s (limit %d per address)", c.RemoteAddr(), n, ip, m.maxPerIP))
			continue
		}
		m.wg.Add(1)
		go m.route(&prefixConn{Conn: c, mux: m, ip: ip})
	}
}

// sourceIP is the key of a's connections in the per-address count: its
// IP address (its string for a non-TCP address).
func sourceIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

// takeIP counts one more connection from ip, or refuses it (ok false)
// when ip has maxPerIP open already (n: how many).
func (m *connMux) takeIP(ip string) (n int64, ok bool) {
	m.ipMu.Lock()
	defer m.ipMu.Unlock()
	n = m.perIP[ip]
	if m.maxPerIP > 0 && n >= m.maxPerIP {
		return n, false
	}
	if m.perIP == nil {
		m.perIP = make(map[string]int64)
	}
	m.perIP[ip] = n + 1
	return n + 1, true
}

// releaseIP counts one connection from ip closed.
func (m *connMux) releaseIP(ip string) {
	m.ipMu.Lock()
	defer m.ipMu.Unlock()
	if m.perIP[ip] <= 1 {
		delete(m.perIP, ip)
		return
	}
	m.perIP[ip]--
}

func (m *connMux) closed() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

var h2Preface = []byte("PRI")

// route runs the TLS handshake of c (when the port serves TLS), reads
// its first (decrypted) bytes and hands it to the gRPC or the HTTP server.
// The handshake and the read are bounded by apiHandshakeTimeout together.
// The connection's slot (conns) is freed when it is closed, whoever closes
// it.
func (m *connMux) route(pc *prefixConn) {
	defer m.wg.Done()
	c := pc.Conn
	_ = c.SetDeadline(time.Now().Add(apiHandshakeTimeout))
	if m.tls != nil {
		tc := tls.Server(c, m.tls)
		if err := tc.Handshake(); err != nil {
			var rh tls.RecordHeaderError
			if errors.As(err, &rh) && rh.Conn != nil {
				answerPlaintext(rh.Conn, rh.RecordHeader[:])
			}
			m.log.Debug("dlockd: TLS handshake failed", "remote", c.RemoteAddr(), "err", err)
			if m.handshakeFailed != nil && m.handshakeFailed(c.RemoteAddr(), err) == tlsFailClientCert {
				lingerAfterAlert(c)
			}
			_ = pc.Close()
			return
		}
		c = tc
		pc.Conn = tc
	}
	buf := make([]byte, len(h2Preface))
	n, err := io.ReadFull(c, buf)
	_ = c.SetDeadline(time.Time{})
	if err != nil {
		_ = pc.Close()
		return
	}
	pc.prefix = buf[:n]
	target := m.http
	if bytes.Equal(buf, h2Preface) {
		target = m.grpc
	}
	select {
	case target.ch <- pc:
	case <-m.done:
		_ = pc.Close()
	}
}

func (m *connMux) close() {
	m.closeOnce.Do(func() {
		close(m.done)
		_ = m.root.Close()
	})
}

// chanListener is a net.Listener fed by the mux.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close does nothing: the mux closes both halves together.
func (l *chanListener) Close() error   { return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

// prefixConn replays the bytes the mux read, and frees the connection's
// slot of the mux when closed.
type prefixConn struct {
	net.Conn
	prefix []byte
	mux    *connMux
	ip     string // the source address's key in mux.perIP
	closed atomic.Bool
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// Close closes the connection; the first call frees its slot.
func (c *prefixConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.mux.conns.Add(-1)
		c.mux.releaseIP(c.ip)
	}
	return err
}

// lingerAfterAlert keeps c (whose handshake failed, the alert sent) open
// for a moment: it shuts its write side and drains what the client sends,
// until the client closes or a second passes. A TLS 1.3 client learns that
// its certificate was refused only when it reads the alert, after its
// handshake is done and it has written its first bytes: closing at once
// would reset the connection under those bytes, and the client would see
// "broken pipe" or "connection reset" instead of the reason.
func lingerAfterAlert(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, c)
}
