package netproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind (a
// proxy or server that was not closed).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echoServer accepts connections on a loopback port and echoes every byte
// back. It is closed when the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func dialProxy(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads it back, and returns how long it took.
func roundTrip(t *testing.T, c net.Conn, msg []byte) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("read back %q, want %q", got, msg)
	}
	return time.Since(start)
}

func TestProxy_Forwards(t *testing.T) {
	p := Start(t, echoServer(t), 1)
	c := dialProxy(t, p)
	roundTrip(t, c, []byte("hello"))
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: many chunks
	roundTrip(t, c, big)
	st := p.Stats()
	if st.Conns != 1 || st.Bytes[Upstream] != int64(5+len(big)) || st.Bytes[Downstream] != int64(5+len(big)) {
		t.Fatalf("stats %+v: want 1 connection and %d bytes each way", st, 5+len(big))
	}
}

func TestProxy_DelaysEachDirection(t *testing.T) {
	p := Start(t, echoServer(t), 2)
	c := dialProxy(t, p)
	if d := roundTrip(t, c, []byte("x")); d >= 40*time.Millisecond {
		t.Logf("undelayed round trip took %v (a loaded machine?)", d)
	}
	for _, dir := range []Direction{Upstream, Downstream} {
		p.SetDelay(Upstream, 0, 0)
		p.SetDelay(Downstream, 0, 0)
		p.SetDelay(dir, 40*time.Millisecond, 50*time.Millisecond)
		if d := roundTrip(t, c, []byte("y")); d < 40*time.Millisecond {
			t.Errorf("%v delay [40ms, 50ms]: round trip took %v", dir, d)
		}
	}
	p.SetDelay(Upstream, 20*time.Millisecond, 20*time.Millisecond)
	p.SetDelay(Downstream, 20*time.Millisecond, 20*time.Millisecond)
	if d := roundTrip(t, c, []byte("z")); d < 40*time.Millisecond {
		t.Errorf("20ms each way: round trip took %v, want at least 40ms", d)
	}
	t.Log(p)
}

// TestProxy_KeepsOrderWithinConnection: random delays never reorder the
// bytes of one connection.
func TestProxy_KeepsOrderWithinConnection(t *testing.T) {
	p := Start(t, echoServer(t), 3)
	p.SetDelay(Upstream, 0, 3*time.Millisecond)
	p.SetDelay(Downstream, 0, 3*time.Millisecond)
	c := dialProxy(t, p)
	const n = 300
	errc := make(chan error, 1)
	go func() {
		var b [4]byte
		for i := range n {
			binary.BigEndian.PutUint32(b[:], uint32(i))
			if _, err := c.Write(b[:]); err != nil {
				errc <- err
				return
			}
			if i%50 == 0 {
				time.Sleep(time.Millisecond) // separate writes into separate chunks
			}
		}
		errc <- nil
	}()
	r := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [4]byte
	for i := range n {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if got := binary.BigEndian.Uint32(b[:]); got != uint32(i) {
			t.Fatalf("message %d arrived as number %d: reordered within a connection", i, got)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestProxy_ReordersAcrossConnections: with random delays, a message sent
// on one connection after a message on another can arrive first.
func TestProxy_ReordersAcrossConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	arrivals := make(chan byte, 1024)
	var wg sync.WaitGroup
	defer wg.Wait()
	var srvConns []net.Conn
	var mu sync.Mutex
	defer func() {
		mu.Lock()
		for _, c := range srvConns {
			_ = c.Close()
		}
		mu.Unlock()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			srvConns = append(srvConns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := make([]byte, 1)
				for {
					if _, err := c.Read(b); err != nil {
						return
					}
					arrivals <- b[0]
				}
			}()
		}
	}()
	p := Start(t, ln.Addr().String(), 4)
	p.SetDelay(Upstream, 0, 10*time.Millisecond)
	a, b := dialProxy(t, p), dialProxy(t, p)
	reordered := 0
	const rounds = 40
	for range rounds {
		if _, err := a.Write([]byte{'a'}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Write([]byte{'b'}); err != nil {
			t.Fatal(err)
		}
		first, second := <-arrivals, <-arrivals
		if first == 'b' && second == 'a' {
			reordered++
		}
	}
	t.Logf("%d of %d pairs arrived reordered", reordered, rounds)
	if reordered == 0 {
		t.Errorf("no pair of %d arrived reordered across two connections with delays in [0, 10ms]", rounds)
	}
	p.Cut()
	_ = p.Close()
	_ = ln.Close()
}

// TestProxy_HoldAndRelease: nothing is delivered while held; everything is,
// in order, after Release.
func TestProxy_HoldAndRelease(t *testing.T) {
	p := Start(t, echoServer(t), 5)
	c := dialProxy(t, p)
	roundTrip(t, c, []byte("before"))
	p.Hold()
	if _, err := c.Write([]byte("held-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("held-2")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
	buf := make([]byte, 64)
	if n, err := c.Read(buf); !isTimeout(err) {
		t.Fatalf("read while held: %d bytes %q, err %v; want a timeout", n, buf[:n], err)
	}
	st := p.Stats()
	p.Release()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len("held-1held-2"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "held-1held-2" {
		t.Fatalf("after release: %q, %v", got, err)
	}
	if st.Bytes[Upstream] != int64(len("before")) {
		t.Errorf("%d bytes delivered upstream while held, want only the %d before", st.Bytes[Upstream], len("before"))
	}
}

// isTimeout says whether err is a net timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestProxy_Cut closes open connections; new ones work.
func TestProxy_Cut(t *testing.T) {
	p := Start(t, echoServer(t), 6)
	c := dialProxy(t, p)
	roundTrip(t, c, []byte("x"))
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut closed %d connections, want 1", n)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read after Cut: %v, want EOF or a reset", err)
	}
	roundTrip(t, dialProxy(t, p), []byte("again"))
	if st := p.Stats(); st.Cut != 1 || st.Conns != 2 {
		t.Fatalf("stats %+v: want 1 cut of 2 connections", st)
	}
}

// TestProxy_CloseWhileHeld: Close ends every goroutine even with bytes
// held (goleak checks in TestMain).
func TestProxy_CloseWhileHeld(t *testing.T) {
	p, err := New(echoServer(t), 7)
	if err != nil {
		t.Fatal(err)
	}
	c := dialProxy(t, p)
	p.Hold()
	if _, err := c.Write([]byte("stuck")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5s while held")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
