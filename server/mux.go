package server

import (
	"bytes"
	"io"
	"net"
	"sync"
	"time"
)

// connMux splits one listener in two by the first bytes of each connection:
// an HTTP/2 client preface ("PRI * HTTP/2.0", what every gRPC client sends
// on a plaintext connection) goes to the gRPC server, served natively by
// grpc-go; anything else (HTTP/1.x: curl, browsers, Prometheus) goes to the
// HTTP server. JSON over h2c prior knowledge is therefore not served.
type connMux struct {
	root net.Listener
	grpc *chanListener
	http *chanListener

	wg        sync.WaitGroup
	closeOnce sync.Once
	done      chan struct{}
}

func newConnMux(root net.Listener) *connMux {
	done := make(chan struct{})
	return &connMux{
		root: root,
		grpc: &chanListener{addr: root.Addr(), ch: make(chan net.Conn), done: done},
		http: &chanListener{addr: root.Addr(), ch: make(chan net.Conn), done: done},
		done: done,
	}
}

// serve accepts until the root listener is closed, then waits for the
// connections being sorted.
func (m *connMux) serve() {
	defer m.wg.Wait()
	for {
		c, err := m.root.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			m.close()
			return
		}
		m.wg.Add(1)
		go m.route(c)
	}
}

var h2Preface = []byte("PRI")

func (m *connMux) route(c net.Conn) {
	defer m.wg.Done()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, len(h2Preface))
	n, err := io.ReadFull(c, buf)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		_ = c.Close()
		return
	}
	pc := &prefixConn{Conn: c, prefix: buf[:n]}
	target := m.http
	if bytes.Equal(buf, h2Preface) {
		target = m.grpc
	}
	select {
	case target.ch <- pc:
	case <-m.done:
		_ = c.Close()
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

// prefixConn replays the bytes the mux read.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
