package testservers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Limits on what a gate reads of a connection before it knows the sender.
const (
	// gateHeadBytes bounds the first request head a gate reads (rafthttp's
	// heads are under 1 KiB).
	gateHeadBytes = 16 << 10
	// gateHeadWait bounds how long a gate waits for that head (etcd sends
	// it at once after connecting).
	gateHeadWait = 2 * time.Second
	// gateDialWait bounds the dial of the member's real peer port (it is
	// refused at once while the member is down).
	gateDialWait = time.Second
)

// etcdGates is the peer gates of a gated EtcdCluster, one a member: each is
// a TCP listener on a free loopback port whose URL the member advertises as
// its peer URL (--initial-advertise-peer-urls and --initial-cluster), while
// the member listens on its real peer port (--listen-peer-urls). A gate
// forwards every connection, both ways, to its member's real peer port,
// except the connections of a sender cut from that member: those it closes
// when the link is cut, and at once when they arrive while it is cut.
//
// etcd members dial each other at the one peer URL each advertises, so a
// gate cannot tell its senders apart by the address they dial; it tells
// them apart by what they send or by who holds the socket:
//
//   - rafthttp puts the sender's advertised peer URLs (its gate's URL) in
//     the X-PeerURLs header of every stream GET (/raft/stream/...),
//     pipeline POST (/raft) and snapshot POST (/raft/snapshot), so the gate
//     reads the connection's first request head and looks for it there;
//   - the requests without it (rafthttp's /raft/probing, which shares the
//     raft round trippers' keep-alive connections, the followers' lease
//     renewals forwarded to the leader on /leases, /version and /members)
//     are told by the socket: the sender's end of a loopback connection is
//     a socket in /proc/net/tcp, and the member holding it has the socket's
//     inode among its /proc/<pid>/fd. Where /proc cannot say (not Linux),
//     such a connection passes, cut or not.
//
// Identifying a connection once, by its first request, is sound because a
// TCP connection is one process's socket: a keep-alive connection carries
// the requests of one member's http.Transport (rafthttp has one for its
// streams and one for its pipelines, etcdserver one for its other peer
// requests), never another's. etcdgate_test.go checks that every
// X-PeerURLs on every connection names the member that holds its socket.
type etcdGates struct {
	urls    []string                      // urls[i]: member i's gate, "http://127.0.0.1:port"
	targets []string                      // targets[i]: member i's real peer address
	pid     func(i int) int               // member i's process id, 0 while it is stopped
	lns     []net.Listener                // lns[i]: member i's gate
	tap     func(to, owner int) io.Writer // tests only: see handle

	mu     sync.Mutex
	cut    [][]bool // cut[from][to]: to's gate refuses from's connections
	conns  map[*gateConn]struct{}
	closed bool
	wg     sync.WaitGroup // the accept loops and the connections' goroutines
}

// gateConn is one connection through a gate.
type gateConn struct {
	to   int      // the member whose gate accepted it
	from int      // the sender's index; -1: unknown; -2: not yet admitted
	down net.Conn // from the sender
	up   net.Conn // to the member's real peer port; nil until dialed
}

// close closes both sides (Close on a closed net.Conn is harmless).
func (c *gateConn) close() {
	c.down.Close()
	if c.up != nil {
		c.up.Close()
	}
}

// startEtcdGates starts a gate on a free loopback port for each of
// targets (the members' real peer addresses, "127.0.0.1:port"); pid gives
// member i's process id for the /proc lookup (0: stopped); tap is nil but
// in tests (see handle). Close stops them.
func startEtcdGates(targets []string, pid func(int) int, tap func(to, owner int) io.Writer) (*etcdGates, error) {
	n := len(targets)
	g := &etcdGates{targets: targets, pid: pid, tap: tap, conns: map[*gateConn]struct{}{}}
	for range n {
		g.cut = append(g.cut, make([]bool, n))
	}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, l := range g.lns {
				l.Close()
			}
			return nil, fmt.Errorf("etcd peer gate: %w", err)
		}
		g.lns = append(g.lns, ln)
		g.urls = append(g.urls, "http://"+ln.Addr().String())
	}
	for i, ln := range g.lns {
		g.wg.Add(1)
		go g.serve(i, ln)
	}
	return g, nil
}

// URL returns member i's gate URL, the peer URL it advertises.
func (g *etcdGates) URL(i int) string { return g.urls[i] }

// partition cuts both directions of the link between members i and j
// where group[i] != group[j] and restores the others, at one instant: each
// gate closes the open connections of the members cut from it and refuses
// their new ones. Both gates of a link must refuse, as each connection
// carries messages both ways (a stream GET from i to j carries j's
// messages to i).
func (g *etcdGates) partition(group []int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.cut {
		for j := range g.cut[i] {
			g.cut[i][j] = i != j && group[i] != group[j]
		}
	}
	for c := range g.conns {
		if c.from >= 0 && g.cut[c.from][c.to] {
			c.close()
		}
	}
}

// isCut reports whether the link between i and j is cut.
func (g *etcdGates) isCut(i, j int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cut[i][j]
}

// Close stops the gates: it closes their listeners and every connection
// through them, and returns when all their goroutines have ended.
func (g *etcdGates) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	for _, ln := range g.lns {
		ln.Close()
	}
	for c := range g.conns {
		c.close()
	}
	g.mu.Unlock()
	g.wg.Wait()
	return nil
}

// serve accepts the connections to member to's gate until Close.
func (g *etcdGates) serve(to int, ln net.Listener) {
	defer g.wg.Done()
	for {
		down, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors
			continue
		}
		c := &gateConn{to: to, from: -2, down: down}
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			down.Close()
			return
		}
		g.conns[c] = struct{}{}
		g.wg.Add(1)
		g.mu.Unlock()
		go g.handle(c)
	}
}

// handle identifies c's sender, then forwards c both ways until either
// side closes it or its link is cut. With tap set (tests), it also writes
// everything the sender sent to tap(c.to, owner), owner being the member
// that holds the sender's socket by /proc (-1: none).
func (g *etcdGates) handle(c *gateConn) {
	defer g.wg.Done()
	defer func() {
		g.mu.Lock()
		delete(g.conns, c)
		g.mu.Unlock()
		c.close()
	}()
	head := readHead(c.down)
	from := g.senderByHeader(head)
	if from < 0 {
		from = g.senderBySocket(c.down)
	}
	var tap io.Writer = io.Discard
	if g.tap != nil {
		tap = g.tap(c.to, g.senderBySocket(c.down))
	}
	// The cut is checked before the dial, so that a refused sender never
	// reaches the member, and again after it, when c.from is recorded:
	// from then on partition closes c itself.
	if !g.admit(c, from, nil) {
		return
	}
	up, err := net.DialTimeout("tcp", g.targets[c.to], gateDialWait)
	if err != nil {
		return // the member is down: the sender sees its connection closed
	}
	if !g.admit(c, from, up) {
		up.Close()
		return
	}
	if _, err := up.Write(head); err != nil {
		return
	}
	_, _ = tap.Write(head)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(c.down, up)
		c.close()
	}()
	_, _ = io.Copy(up, io.TeeReader(c.down, tap))
	c.close()
	<-done
}

// admit reports whether c, from sender from, may pass to-member's gate
// now (the gates are open and the link is not cut); with up it also
// records the connection to the member, for partition and Close to close.
func (g *etcdGates) admit(c *gateConn, from int, up net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || (from >= 0 && g.cut[from][c.to]) {
		return false
	}
	if up != nil {
		c.from, c.up = from, up
	}
	return true
}

// readHead reads from c until the end of the first HTTP request head
// ("\r\n\r\n"), gateHeadBytes or gateHeadWait, whichever comes first, and
// returns what it read (all of which must still be forwarded).
func readHead(c net.Conn) []byte {
	_ = c.SetReadDeadline(time.Now().Add(gateHeadWait))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, gateHeadBytes)
	n := 0
	for n < len(buf) && !bytes.Contains(buf[:n], []byte("\r\n\r\n")) {
		k, err := c.Read(buf[n:])
		n += k
		if err != nil {
			break
		}
	}
	return buf[:n]
}

// senderByHeader returns the index of the member whose gate URL the
// head's X-PeerURLs header names (rafthttp sends the sender's advertised
// peer URLs there, comma-separated), or -1 when it names none.
func (g *etcdGates) senderByHeader(head []byte) int {
	end := bytes.Index(head, []byte("\r\n\r\n"))
	if end < 0 {
		return -1
	}
	for _, line := range strings.Split(string(head[:end]), "\r\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || !strings.EqualFold(strings.TrimSpace(name), "X-PeerURLs") {
			continue
		}
		for _, u := range strings.Split(value, ",") {
			if i := g.member(strings.TrimSpace(u)); i >= 0 {
				return i
			}
		}
	}
	return -1
}

// member returns the index of the member whose gate URL is u, or -1.
func (g *etcdGates) member(u string) int {
	for i, v := range g.urls {
		if u == v {
			return i
		}
	}
	return -1
}

// senderBySocket returns the index of the member whose process holds the
// sender's end of c, a loopback TCP connection accepted by a gate: the
// socket's inode from /proc/net/tcp, then the member whose /proc/<pid>/fd
// has it. It returns -1 when no member holds it or /proc cannot tell.
func (g *etcdGates) senderBySocket(c net.Conn) int {
	inode := tcpInode(c.RemoteAddr(), c.LocalAddr())
	if inode == "" {
		return -1
	}
	want := "socket:[" + inode + "]"
	for i := range g.targets {
		pid := g.pid(i)
		if pid == 0 {
			continue
		}
		dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(dir + fd.Name()); err == nil && l == want {
				return i
			}
		}
	}
	return -1
}

// tcpInode returns the inode, in decimal, of the IPv4 TCP socket whose
// local address is local and remote address is remote, from
// /proc/net/tcp; "" when there is none (or no /proc).
func tcpInode(local, remote net.Addr) string {
	l, r := procTCPAddr(local), procTCPAddr(remote)
	if l == "" || r == "" {
		return ""
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return ""
	}
	// "  sl  local_address rem_address   st tx_queue:rx_queue tr:tm->when retrnsmt   uid  timeout inode ..."
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == l && f[2] == r && f[9] != "0" {
			return f[9]
		}
	}
	return ""
}

// procTCPAddr formats an IPv4 TCP address as /proc/net/tcp does: the
// address as the kernel's 32-bit word in hex (so in native byte order),
// a colon, the port in hex. It returns "" for anything else.
func procTCPAddr(a net.Addr) string {
	t, ok := a.(*net.TCPAddr)
	if !ok {
		return ""
	}
	ip := t.IP.To4()
	if ip == nil {
		return ""
	}
	return fmt.Sprintf("%08X:%04X", binary.NativeEndian.Uint32(ip), t.Port)
}
