package server

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// raftHandshakeTimeout bounds the TLS handshake of one Raft connection, both
// ways: a peer that connects and sends nothing holds no goroutine longer.
const raftHandshakeTimeout = 10 * time.Second

// errStreamClosed is returned by Accept once the stream layer is closed.
var errStreamClosed = errors.New("dlockd: raft stream layer closed")

// streamLayer is the Raft transport's stream layer (raft.StreamLayer): TCP
// on Config.RaftBind, with mutual TLS when Config.PeerCertFile,
// PeerKeyFile and PeerCAFile are set. Both sides present a certificate
// signed by the peer CA and verify the other's (tls.RequireAndVerifyClientCert
// on accept; the dialled address's host as the server name on dial), so the
// Raft port accepts only members. Connections are accepted (and their
// handshakes run) in the layer's own goroutines, so a slow or silent peer
// never holds up Raft's accept loop.
//
// The layer has a gate: while it is shut, accepted Raft connections are
// closed at once (membership probes are still answered, see probeByte). A node that joins a running cluster keeps it shut until the
// leader has agreed to add it (see Server.joinLoop), so that a node whose
// data directory was wiped can never be reached by a leader that still
// counts it as a member holding the old log; a node started with
// InitialCluster on an empty data directory keeps it shut until its probe
// of the other members allows it (see Server.bootstrapLoop).
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	// tls is the mutual TLS configuration of accepts and dials (nil: plain
	// TCP), swapped by setTLS when the files are reloaded (reloadTLS):
	// each handshake takes the current one.
	tls      atomic.Pointer[tls.Config]
	reloadMu sync.Mutex // serializes reloads when the API has no TLS (tls.go)
	rewrite  map[string]string
	onProbe  func(probeRequest) probeAnswer // answers probes (nil: none answered)

	open   atomic.Bool
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	mu      sync.Mutex
	pending map[net.Conn]struct{}     // connections in their handshake
	live    map[*trackedConn]struct{} // connections handed to Raft, closed by Close
	down    bool                      // Close ran: new connections are closed at once
}

// trackedConn is a connection handed to Raft; the layer closes it on Close
// (raft's NetworkTransport.Close leaves its connections open, and their
// reading goroutines with them).
//
// An accepted connection is served by raft's handleConn goroutine, which
// closes it when it returns (and calls into Raft, heartbeats included,
// until then): its Close marks the handler done (handled), so that the
// layer's Close can wait for the handlers and the server closes its stores
// only after the last one returned. A heartbeat handled after the stable
// store was closed made raft panic ("failed to save current term: database
// not open").
type trackedConn struct {
	net.Conn
	l       *streamLayer
	once    sync.Once
	handled chan struct{} // accepted connections: closed by the first Close from Raft
	hOnce   sync.Once
}

// Close closes the connection and forgets it. Raft calls it when it is done
// with the connection.
func (c *trackedConn) Close() error {
	if c.handled != nil {
		c.hOnce.Do(func() { close(c.handled) })
	}
	return c.shut()
}

// shut closes the connection and forgets it, without marking its handler
// done (the layer's Close uses it).
func (c *trackedConn) shut() error {
	var err error
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.live, c)
		c.l.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}

// track wraps c so that Close closes it; a closed layer closes c at once.
// accepted says c goes to Raft's handler (see trackedConn).
func (l *streamLayer) track(c net.Conn, accepted bool) (net.Conn, error) {
	tc := &trackedConn{Conn: c, l: l}
	if accepted {
		tc.handled = make(chan struct{})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		_ = c.Close()
		return nil, errStreamClosed
	}
	l.live[tc] = struct{}{}
	return tc, nil
}

// newStreamLayer listens on cfg.RaftBind. The advertised address is
// advertise when not empty, else the bound address (which must then be
// dialable: not 0.0.0.0).
// onProbe answers membership probes (see probeByte); open sets the gate.
// A peer certificate, key or CA that cannot be read is an error matching
// ErrConfig.
func newStreamLayer(cfg Config, advertise string, open bool, onProbe func(probeRequest) probeAnswer) (*streamLayer, error) {
	var tc *tls.Config
	if cfg.PeerCertFile != "" {
		m, err := readTLSMaterial(Config{PeerCertFile: cfg.PeerCertFile, PeerKeyFile: cfg.PeerKeyFile, PeerCAFile: cfg.PeerCAFile})
		if err != nil {
			return nil, err
		}
		tc = m.raft
	}
	ln, err := net.Listen("tcp", cfg.RaftBind)
	if err != nil {
		return nil, err
	}
	var adv net.Addr = ln.Addr()
	if advertise != "" {
		if adv, err = net.ResolveTCPAddr("tcp", advertise); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("raft advertise address %q: %w", advertise, err)
		}
	}
	if ta, ok := adv.(*net.TCPAddr); !ok || ta.IP == nil || ta.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("raft address %s cannot be dialled by other nodes: set --raft-advertise", adv)
	}
	l := &streamLayer{
		ln: ln, advertise: adv, rewrite: cfg.RaftDialRewrite, onProbe: onProbe,
		conns: make(chan net.Conn), closed: make(chan struct{}), pending: make(map[net.Conn]struct{}), live: make(map[*trackedConn]struct{}),
	}
	l.tls.Store(tc)
	l.open.Store(open)
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// tlsConfig returns the current mutual TLS configuration (nil: plain
// TCP).
func (l *streamLayer) tlsConfig() *tls.Config { return l.tls.Load() }

// setTLS makes c the configuration of the next handshakes, accepted and
// dialled (reloadTLS); open connections keep theirs. A layer without
// TLS stays without.
func (l *streamLayer) setTLS(c *tls.Config) {
	if c != nil && l.tls.Load() != nil {
		l.tls.Store(c)
	}
}

// setOpen opens or shuts the gate (see streamLayer). Shutting it also
// closes every open connection, and Dial then fails: a node whose
// membership was refused is cut off from Raft both ways.
func (l *streamLayer) setOpen(v bool) {
	l.open.Store(v)
	if v {
		return
	}
	l.mu.Lock()
	live := make([]*trackedConn, 0, len(l.live))
	for c := range l.live {
		live = append(live, c)
	}
	l.mu.Unlock()
	for _, c := range live {
		_ = c.Close()
	}
}

func (l *streamLayer) acceptLoop() {
	defer l.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.closed:
				return
			default:
			}
			// EMFILE and the like: wait and retry, never close the port.
			select {
			case <-l.closed:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		l.mu.Lock()
		if l.down {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.pending[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serveConn(c)
	}
}

// serveConn runs the TLS handshake of an accepted connection (when peer
// TLS is on) and reads its first byte: a probe (probeByte) is answered
// here and closed; anything else is a Raft connection, handed to Accept
// while the gate is open and closed while it is shut.
func (l *streamLayer) serveConn(c net.Conn) {
	defer l.wg.Done()
	done := func() {
		l.mu.Lock()
		delete(l.pending, c)
		l.mu.Unlock()
	}
	_ = c.SetDeadline(time.Now().Add(raftHandshakeTimeout))
	conn := c
	if cfg := l.tls.Load(); cfg != nil {
		tc := tls.Server(c, cfg)
		if err := tc.Handshake(); err != nil {
			done()
			_ = c.Close()
			return
		}
		conn = tc
	}
	var first [1]byte
	if _, err := io.ReadFull(conn, first[:]); err != nil {
		done()
		_ = conn.Close()
		return
	}
	if first[0] == probeByte {
		l.answerProbe(conn)
		done()
		_ = conn.Close()
		return
	}
	done()
	if !l.open.Load() {
		_ = conn.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	l.deliver(&peekedConn{Conn: conn, first: first[0], has: true})
}

// peekedConn is a connection whose first byte was read by the layer: Read
// returns it first.
type peekedConn struct {
	net.Conn
	first byte
	has   bool
}

// Read returns the peeked byte, then what the connection reads.
func (c *peekedConn) Read(p []byte) (int, error) {
	if c.has && len(p) > 0 {
		p[0] = c.first
		c.has = false
		return 1, nil
	}
	return c.Conn.Read(p)
}

// deliver hands c to Accept, or closes it when the layer is closed.
func (l *streamLayer) deliver(c net.Conn) {
	c, err := l.track(c, true)
	if err != nil {
		return
	}
	select {
	case l.conns <- c:
	case <-l.closed:
		_ = c.Close()
	}
}

// Accept returns the next connection (its TLS handshake done).
func (l *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, errStreamClosed
	}
}

// Close stops accepting and closes every connection: in its handshake,
// accepted, or dialled.
func (l *streamLayer) Close() error {
	var err error
	l.once.Do(func() {
		close(l.closed)
		err = l.ln.Close()
		l.mu.Lock()
		l.down = true
		for c := range l.pending {
			_ = c.Close()
		}
		live := make([]*trackedConn, 0, len(l.live))
		for c := range l.live {
			live = append(live, c)
		}
		l.mu.Unlock()
		for _, c := range live {
			_ = c.shut()
		}
		l.wg.Wait()
		// Wait (bounded) for Raft's handlers of accepted connections to
		// return: they see the closed connection at their next read.
		deadline := time.NewTimer(2 * time.Second)
		defer deadline.Stop()
		for _, c := range live {
			if c.handled == nil {
				continue
			}
			select {
			case <-c.handled:
			case <-deadline.C:
				return
			}
		}
	})
	return err
}

// Addr returns the advertised Raft address of this node.
func (l *streamLayer) Addr() net.Addr { return l.advertise }

// Dial connects to a member's Raft address (through Config.RaftDialRewrite
// when it names address), with the TLS handshake when peer TLS is on: the
// member must present a certificate of the peer CA valid for address's host.
// It fails while the gate is shut.
func (l *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if !l.open.Load() {
		return nil, errors.New("dlockd: raft port shut (not a member yet, or membership refused)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := l.dial(ctx, string(address))
	if err != nil {
		return nil, err
	}
	return l.track(c, false)
}

// dial connects to address as Dial does, whatever the gate.
func (l *streamLayer) dial(ctx context.Context, address string) (net.Conn, error) {
	target := address
	if r, ok := l.rewrite[target]; ok {
		target = r
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, err
	}
	cfg := l.tls.Load()
	if cfg == nil {
		return c, nil
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	tc := cfg.Clone()
	tc.ServerName = host
	conn := tls.Client(c, tc)
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("raft TLS handshake with %s: %w", address, err)
	}
	return conn, nil
}

// The membership probe.
//
// Before a node on an empty data directory takes part in Raft (see
// Server.bootstrapLoop) it asks the other initial members, on their Raft
// port, what they know of its node ID. A probe connection starts with
// probeByte, a value hashicorp/raft's NetworkTransport never sends first
// (its RPC types are 0 to 4), so the layer can tell it from a Raft
// connection after the TLS handshake (the same mutual TLS: only members
// probe or are probed). The request and the answer are each a 4-byte
// big-endian length and a JSON object (probeRequest, probeAnswer) of at
// most maxProbeBytes. The layer answers probes whether its gate is open
// or shut, so that members that are all still probing answer each other.

// probeByte is the first byte of a probe connection.
const probeByte = 0xD1

// maxProbeBytes bounds a probe request or answer.
const maxProbeBytes = 64 << 10

// probeRequest asks a member what it knows of node ID.
type probeRequest struct {
	// ID is the asking node's ID.
	ID string `json:"id"`
}

// probeAnswer is what a member knows of the asking node ID.
type probeAnswer struct {
	// NodeID is the answering member's ID.
	NodeID string `json:"node_id"`
	// HasState is true when the answering member has Raft state (it
	// bootstrapped, joined or restarted on its data); false while it is
	// itself on an empty data directory, probing.
	HasState bool `json:"has_state"`
	// Incarnation is the incarnation the member's registry records for the
	// asked ID ("" when none: not registered, or not known to it).
	Incarnation string `json:"incarnation,omitempty"`
	// LastIndex is the answering member's last log index: 1 after a
	// bootstrap alone, more once a leader was elected.
	LastIndex uint64 `json:"last_index,omitempty"`
	// Term is the answering member's current term.
	Term uint64 `json:"term,omitempty"`
	// LeaderAPI is the API address of the leader as the answering member
	// knows it ("" when unknown).
	LeaderAPI string `json:"leader_api,omitempty"`
}

// answerProbe reads a probe request from c (its first byte already read)
// and writes the answer of l.onProbe.
func (l *streamLayer) answerProbe(c net.Conn) {
	var req probeRequest
	if err := readProbeMsg(c, &req); err != nil || l.onProbe == nil {
		return
	}
	_ = writeProbeMsg(c, l.onProbe(req))
}

// probe asks the member at address (a Raft address, dialled as Dial does
// but whatever the gate) what it knows of req.ID.
func (l *streamLayer) probe(ctx context.Context, address string, req probeRequest) (probeAnswer, error) {
	c, err := l.dial(ctx, address)
	if err != nil {
		return probeAnswer{}, err
	}
	defer func() { _ = c.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := c.Write([]byte{probeByte}); err != nil {
		return probeAnswer{}, err
	}
	if err := writeProbeMsg(c, req); err != nil {
		return probeAnswer{}, err
	}
	var a probeAnswer
	if err := readProbeMsg(c, &a); err != nil {
		return probeAnswer{}, fmt.Errorf("probe answer from %s: %w", address, err)
	}
	return a, nil
}

func writeProbeMsg(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxProbeBytes {
		return fmt.Errorf("probe message of %d bytes > %d", len(b), maxProbeBytes)
	}
	_, err = w.Write(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b))))
	if err == nil {
		_, err = w.Write(b)
	}
	return err
}

func readProbeMsg(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxProbeBytes {
		return fmt.Errorf("probe message of %d bytes > %d", n, maxProbeBytes)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

var _ raft.StreamLayer = (*streamLayer)(nil)

// voteTransport is the Raft transport with one change: a vote request
// (RequestVote, RequestPreVote) or a leadership transfer's TimeoutNow that
// fails as a dead connection does (EOF, reset, broken pipe) is sent again,
// up to staleConnRetries more times. hashicorp/raft's NetworkTransport
// keeps up to MaxPool connections per peer and reuses them; a peer that
// restarted since leaves them dead, and each RPC that takes one fails on
// it and drops it. Replication retries by itself, but a candidate sends
// one vote request per peer per election: with both peers restarted since
// it last spoke to them, it lost every vote to dead connections and
// another voter won the next election (a leadership transfer to it landed
// elsewhere, seen in a break test). A vote request is safe to repeat: a
// voter grants the same candidate again in the same term, and a dead
// connection delivered nothing.
type voteTransport struct{ *raft.NetworkTransport }

// staleConnRetries is how many more times a vote request is sent after a
// dead connection: one per connection the pool may hold (MaxPool).
const staleConnRetries = 3

// RequestVote implements raft.Transport (see voteTransport).
func (t voteTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	return retryDeadConn(func() error { return t.NetworkTransport.RequestVote(id, target, args, resp) })
}

// RequestPreVote implements raft.WithPreVote (see voteTransport).
func (t voteTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return retryDeadConn(func() error { return t.NetworkTransport.RequestPreVote(id, target, args, resp) })
}

// TimeoutNow implements raft.Transport (see voteTransport).
func (t voteTransport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	return retryDeadConn(func() error { return t.NetworkTransport.TimeoutNow(id, target, args, resp) })
}

// retryDeadConn runs rpc, again while it fails as a dead connection does.
func retryDeadConn(rpc func() error) error {
	err := rpc()
	for i := 0; i < staleConnRetries && deadConn(err); i++ {
		err = rpc()
	}
	return err
}

// deadConn reports whether err is what an RPC on a connection whose peer
// is gone returns.
func deadConn(err error) bool {
	return err != nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed))
}
