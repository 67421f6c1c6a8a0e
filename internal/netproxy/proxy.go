// Package netproxy is a TCP proxy for fault tests: it delays each
// direction by a random amount, holds all traffic (a blackhole) and
// releases it in order, and cuts connections, so that tests can put any
// client-server or node-node link under a fault. It listens on 127.0.0.1
// only; hashicorp/raft's Partition and Jepsen's nemeses are its models.
package netproxy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Direction names one way of the traffic through a Proxy.
type Direction int

const (
	// Upstream is the client-to-server way: bytes read from accepted
	// connections and written to the target.
	Upstream Direction = iota
	// Downstream is the server-to-client way.
	Downstream
)

func (d Direction) String() string {
	switch d {
	case Upstream:
		return "upstream"
	case Downstream:
		return "downstream"
	}
	return fmt.Sprintf("Direction(%d)", int(d))
}

// proxyChunkBytes is the largest chunk read (and delayed) as one unit.
const proxyChunkBytes = 32 << 10

// proxyQueueChunks bounds the chunks in flight in one direction of one
// connection: with 32 KiB chunks, at most 8 MiB are buffered (a held or
// slow direction pushes back on its sender, as a full TCP window would).
const proxyQueueChunks = 256

// Proxy is a TCP proxy on a loopback port in front of one target address
// (a dlockd API or Raft port), for fault injection in tests, modelled on
// hashicorp/raft's Partition. Every accepted connection is forwarded to the
// target over its own connection, and each direction of each connection can
// be:
//
//   - delayed: every chunk read is held for a random duration in [min, max]
//     (SetDelay), drawn independently per chunk. A chunk is never delivered
//     before an earlier chunk of the same direction and connection, so each
//     connection keeps TCP's ordering, but two connections are delayed
//     independently: calls on different connections (one gRPC ClientConn
//     each) can overtake each other.
//   - held (Hold): nothing is delivered in either direction of any
//     connection, new or old, until Release; the held bytes are then
//     delivered in order (a blackhole that heals, not one that drops).
//   - dropped (Drop): every chunk read in that direction of any connection
//     is discarded instead of delivered, until Drop(dir, false). Drop
//     (Downstream, true) models a request that reaches the server whose
//     reply is lost; the stream is then corrupt, so heal with Cut as well.
//   - cut (Cut): every open connection is closed on both sides at once, as
//     a broken network path would be.
//   - retargeted (SetTarget): connections accepted later are forwarded to
//     another address, existing ones keep theirs, as a failover behind a
//     virtual IP would be.
//
// The zero delay forwards at once. All methods are safe for concurrent use.
// String describes the current plan, for test logs.
type Proxy struct {
	ln net.Listener

	mu     sync.Mutex
	target string
	drop   [2]bool             // [direction]: discard chunks read
	delay  [2][2]time.Duration // [direction]{min, max}
	held   chan struct{}       // non-nil while held; closed by Release
	conns  map[*proxyConn]struct{}
	closed bool
	rng    *rand.Rand
	stats  ProxyStats

	wg sync.WaitGroup
}

// ProxyStats counts what a Proxy did.
type ProxyStats struct {
	// Conns is the number of connections accepted and forwarded.
	Conns int
	// Chunks and Bytes count what was delivered, per Direction.
	Chunks, Bytes [2]int64
	// Dropped counts the bytes discarded by Drop, per Direction.
	Dropped [2]int64
	// Cut is the number of connections closed by Cut.
	Cut int
}

// New starts a proxy on a free loopback port in front of target
// (host:port) with no delay. seed seeds the random delays, so that a
// failing run's plan can be logged and replayed. Close stops it.
func New(target string, seed uint64) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netproxy: proxy listen: %w", err)
	}
	p := &Proxy{
		target: target, ln: ln,
		conns: make(map[*proxyConn]struct{}),
		rng:   rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// TB is the part of testing.TB that Start uses; testservers.TB and every
// testing.TB satisfy it, so proxies can be started outside go test too.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(f func())
}

// Start is New for a test: it fails the test when the proxy
// cannot start and closes the proxy when the test ends.
func Start(t TB, target string, seed uint64) *Proxy {
	t.Helper()
	p, err := New(target, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Addr returns the proxy's host:port: connect here instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the host:port the proxy forwards new connections to.
func (p *Proxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// SetTarget makes the proxy forward connections accepted from now on to
// addr (host:port); connections already open stay with the old target
// (Cut them to move every client).
func (p *Proxy) SetTarget(addr string) {
	p.mu.Lock()
	p.target = addr
	p.mu.Unlock()
}

// Drop, while on, discards every chunk later read in direction dir on any
// connection, new or old, instead of delivering it (counted in
// ProxyStats.Dropped); Drop(dir, false) delivers again. Chunks already
// read are still delivered. The dropped bytes leave a hole in the stream,
// so a caller healing a Drop normally Cuts the connections too.
func (p *Proxy) Drop(dir Direction, on bool) {
	if dir != Upstream && dir != Downstream {
		panic(fmt.Sprintf("netproxy: proxy Drop(%v): want a direction", dir))
	}
	p.mu.Lock()
	p.drop[dir] = on
	p.mu.Unlock()
}

// SetDelay makes every chunk later read in direction dir wait a random
// duration in [lo, hi] before it is delivered. SetDelay(dir, 0, 0)
// removes the delay. Chunks already read keep the delay they were given.
// It panics when lo < 0 or hi < lo.
func (p *Proxy) SetDelay(dir Direction, lo, hi time.Duration) {
	if lo < 0 || hi < lo || (dir != Upstream && dir != Downstream) {
		panic(fmt.Sprintf("netproxy: proxy SetDelay(%v, %v, %v): want a direction and 0 <= min <= max", dir, lo, hi))
	}
	p.mu.Lock()
	p.delay[dir] = [2]time.Duration{lo, hi}
	p.mu.Unlock()
}

// Hold stops delivering bytes in both directions of every connection until
// Release. Connections are still accepted (and their bytes held). Holding a
// held proxy does nothing.
func (p *Proxy) Hold() {
	p.mu.Lock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
	p.mu.Unlock()
}

// Release delivers what was held, in order, and ends Hold. Releasing a
// proxy that is not held does nothing.
func (p *Proxy) Release() {
	p.mu.Lock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
	p.mu.Unlock()
}

// Cut closes every open connection on both sides, dropping bytes not yet
// delivered, and returns how many it closed. New connections are accepted
// afterwards as before.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	cs := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.stats.Cut += len(cs)
	p.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
	return len(cs)
}

// Stats returns counters of what the proxy did so far.
func (p *Proxy) Stats() ProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// String describes the proxy's plan: addresses, delays, held or not,
// dropping, open connections.
func (p *Proxy) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	state := "flowing"
	if p.held != nil {
		state = "held"
	}
	for _, d := range []Direction{Upstream, Downstream} {
		if p.drop[d] {
			state += ", dropping " + d.String()
		}
	}
	return fmt.Sprintf("proxy %s -> %s: upstream delay [%v, %v], downstream delay [%v, %v], %s, %d open connections",
		p.ln.Addr(), p.target, p.delay[Upstream][0], p.delay[Upstream][1],
		p.delay[Downstream][0], p.delay[Downstream][1], state, len(p.conns))
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to end. Closing twice returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// draw returns the delay of one chunk in direction dir.
func (p *Proxy) draw(dir Direction) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	lo, hi := p.delay[dir][0], p.delay[dir][1]
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(p.rng.Int64N(int64(hi-lo)+1))
}

// dropChunk reports whether a chunk of n bytes just read in direction dir
// is to be discarded, and counts it if so.
func (p *Proxy) dropChunk(dir Direction, n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.drop[dir] {
		return false
	}
	p.stats.Dropped[dir] += int64(n)
	return true
}

// holdCh returns a channel to wait on while the proxy is held, or nil.
func (p *Proxy) holdCh() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

func (p *Proxy) delivered(dir Direction, n int) {
	p.mu.Lock()
	p.stats.Chunks[dir]++
	p.stats.Bytes[dir] += int64(n)
	p.mu.Unlock()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return // closed (a loopback listener has no temporary errors worth retrying)
		}
		up, err := net.DialTimeout("tcp", p.Target(), 5*time.Second)
		if err != nil {
			_ = down.Close() // the client sees a refused target as a closed connection
			continue
		}
		c := &proxyConn{p: p, down: down, up: up, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = down.Close()
			_ = up.Close()
			return
		}
		p.conns[c] = struct{}{}
		p.stats.Conns++
		p.mu.Unlock()
		c.wg.Add(4)
		p.wg.Add(1)
		go c.run()
	}
}

// proxyConn is one forwarded connection: down is the accepted (client) side,
// up the target side.
type proxyConn struct {
	p        *Proxy
	down, up net.Conn
	done     chan struct{} // closed by close
	once     sync.Once
	wg       sync.WaitGroup
}

type proxyChunk struct {
	b   []byte
	due time.Time
}

func (c *proxyConn) run() {
	defer c.p.wg.Done()
	toUp := make(chan proxyChunk, proxyQueueChunks)
	toDown := make(chan proxyChunk, proxyQueueChunks)
	go c.read(Upstream, c.down, toUp)
	go c.write(Upstream, c.up, toUp)
	go c.read(Downstream, c.up, toDown)
	go c.write(Downstream, c.down, toDown)
	c.wg.Wait()
	c.close()
	c.p.mu.Lock()
	delete(c.p.conns, c)
	c.p.mu.Unlock()
}

// close closes both sides once; the four goroutines then end.
func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.done)
		_ = c.down.Close()
		_ = c.up.Close()
	})
}

// read reads chunks from src, stamps each with its due time, and queues
// them for write; at EOF or error it closes the queue.
func (c *proxyConn) read(dir Direction, src net.Conn, q chan<- proxyChunk) {
	defer c.wg.Done()
	defer close(q)
	for {
		buf := make([]byte, proxyChunkBytes)
		n, err := src.Read(buf)
		if n > 0 && !c.p.dropChunk(dir, n) {
			ch := proxyChunk{b: buf[:n], due: time.Now().Add(c.p.draw(dir))}
			select {
			case q <- ch:
			case <-c.done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// write delivers queued chunks to dst in order, each no earlier than its
// due time and never while the proxy is held. When the queue ends (the
// source closed) it half-closes dst; on a write error it closes the
// connection.
func (c *proxyConn) write(dir Direction, dst net.Conn, q <-chan proxyChunk) {
	defer c.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var ch proxyChunk
		var ok bool
		select {
		case ch, ok = <-q:
		case <-c.done:
			return
		}
		if !ok {
			if tc, isTCP := dst.(*net.TCPConn); isTCP {
				_ = tc.CloseWrite()
			} else {
				c.close()
			}
			return
		}
		if d := time.Until(ch.due); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-c.done:
				return
			}
		}
		for h := c.p.holdCh(); h != nil; h = c.p.holdCh() {
			select {
			case <-h:
			case <-c.done:
				return
			}
		}
		if _, err := dst.Write(ch.b); err != nil {
			c.close()
			return
		}
		c.p.delivered(dir, len(ch.b))
	}
}
