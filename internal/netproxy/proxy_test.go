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
	return taggedEchoServer(t, "")
}

// taggedEchoServer is echoServer that first sends tag on each connection,
// so that a test can tell servers apart.
func taggedEchoServer(t *testing.T, tag string) string {
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
				if tag != "" {
					if _, err := io.WriteString(c, tag); err != nil {
						_ = c.Close()
						return
					}
				}
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

// waitStats polls p.Stats until ok accepts them or 5 s pass.
func waitStats(t *testing.T, p *Proxy, what string, ok func(ProxyStats) bool) ProxyStats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := p.Stats()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: want %s", st, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expectSilence fails the test when anything arrives on c within d.
func expectSilence(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if n > 0 || !isTimeout(err) {
		t.Fatalf("read %q, %v: want nothing (a timeout)", buf[:n], err)
	}
}

// TestProxy_DropDownstream: the request reaches the server but its reply
// is lost, on old and new connections alike; after Drop(off) and Cut new
// connections work again.
func TestProxy_DropDownstream(t *testing.T) {
	p := Start(t, echoServer(t), 8)
	old := dialProxy(t, p)
	roundTrip(t, old, []byte("warm"))
	p.Drop(Downstream, true)
	if s := p.String(); !bytes.Contains([]byte(s), []byte("dropping downstream")) {
		t.Errorf("String %q does not say it drops downstream", s)
	}
	if _, err := old.Write([]byte("lost-reply")); err != nil {
		t.Fatal(err)
	}
	fresh := dialProxy(t, p)
	if _, err := fresh.Write([]byte("also-lost")); err != nil {
		t.Fatal(err)
	}
	n := int64(len("lost-reply") + len("also-lost"))
	st := waitStats(t, p, "the requests delivered and the replies dropped", func(st ProxyStats) bool {
		return st.Bytes[Upstream] == int64(len("warm"))+n && st.Dropped[Downstream] == n
	})
	if st.Bytes[Downstream] != int64(len("warm")) || st.Dropped[Upstream] != 0 {
		t.Fatalf("stats %+v: want only the warm-up delivered downstream, nothing dropped upstream", st)
	}
	expectSilence(t, old, 100*time.Millisecond)
	expectSilence(t, fresh, 10*time.Millisecond)

	p.Drop(Downstream, false)
	if cut := p.Cut(); cut != 2 {
		t.Fatalf("Cut closed %d connections, want 2", cut)
	}
	roundTrip(t, dialProxy(t, p), []byte("healed"))
	if st := p.Stats(); st.Dropped[Downstream] != n {
		t.Fatalf("stats %+v: dropped more after Drop(off)", st)
	}
}

// TestProxy_DropUpstream: nothing reaches the server while upstream is
// dropped; chunks read after Drop(off) flow on the same connection.
func TestProxy_DropUpstream(t *testing.T) {
	p := Start(t, echoServer(t), 9)
	c := dialProxy(t, p)
	p.Drop(Upstream, true)
	if _, err := c.Write([]byte("never")); err != nil {
		t.Fatal(err)
	}
	waitStats(t, p, "5 bytes dropped upstream", func(st ProxyStats) bool { return st.Dropped[Upstream] == 5 })
	expectSilence(t, c, 100*time.Millisecond)
	if st := p.Stats(); st.Bytes[Upstream] != 0 || st.Bytes[Downstream] != 0 {
		t.Fatalf("stats %+v: bytes delivered while upstream dropped", st)
	}
	p.Drop(Upstream, false)
	roundTrip(t, c, []byte("after"))
}

// TestProxy_DropRejectsBadDirection panics on an unknown direction.
func TestProxy_DropRejectsBadDirection(t *testing.T) {
	p := Start(t, echoServer(t), 10)
	defer func() {
		if recover() == nil {
			t.Fatal("Drop(Direction(5)) did not panic")
		}
	}()
	p.Drop(Direction(5), true)
}

// readTag reads the len(want) bytes a tagged echo server sends first.
func readTag(t *testing.T, c net.Conn, want string) {
	t.Helper()
	got := make([]byte, len(want))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read tag: %v", err)
	}
	if string(got) != want {
		t.Fatalf("connected to %q, want %q", got, want)
	}
}

// TestProxy_SetTarget: connections accepted after SetTarget go to the new
// target; an open one stays with the old.
func TestProxy_SetTarget(t *testing.T) {
	a, b := taggedEchoServer(t, "A"), taggedEchoServer(t, "B")
	p := Start(t, a, 11)
	if p.Target() != a {
		t.Fatalf("Target %q, want %q", p.Target(), a)
	}
	old := dialProxy(t, p)
	readTag(t, old, "A")
	roundTrip(t, old, []byte("one"))

	p.SetTarget(b)
	if p.Target() != b {
		t.Fatalf("Target %q after SetTarget, want %q", p.Target(), b)
	}
	fresh := dialProxy(t, p)
	readTag(t, fresh, "B")
	roundTrip(t, fresh, []byte("two"))
	roundTrip(t, old, []byte("still A")) // the old connection is untouched
	if st := p.Stats(); st.Conns != 2 || st.Cut != 0 {
		t.Fatalf("stats %+v: want 2 connections, none cut", st)
	}

	// After a Cut, the old client's reconnect lands on the new target.
	p.Cut()
	readTag(t, dialProxy(t, p), "B")
	p.SetTarget(a)
	readTag(t, dialProxy(t, p), "A")
}
