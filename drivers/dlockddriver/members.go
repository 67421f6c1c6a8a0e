package dlockddriver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/internal/notgrpc"
	"github.com/dlock-dev/dlock/internal/urlparam"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// This file owns the members of a dlockd cluster as the Driver sees them:
// one lazily made gRPC connection per member's API address (shared between
// the process's Drivers: connshare.go), the member
// believed to lead, the decoding of the servers' leader hints, and the
// routine that runs one call on the leader, following hints and failing
// over to the next member.

// Tuning of leader following. The pauses are short: an election takes about
// one Raft election timeout (1 s by default), and a call keeps trying until
// its context ends anyway.
const (
	// pauseMin and pauseMax bound the jittered pause before trying again
	// when no member knows a leader (an election): full jitter, doubling
	// from pauseMin up to pauseMax.
	pauseMin = 20 * time.Millisecond
	pauseMax = 400 * time.Millisecond
	// maxExtraMembers bounds the members learned from hints (addresses not
	// in the URL), so that a confused or hostile server cannot make the
	// Driver dial without end.
	maxExtraMembers = 16
	// noDeadlineBudget bounds the failover of a call whose context has no
	// deadline.
	noDeadlineBudget = 10 * time.Second
	// minAttempt is the shortest time one attempt on one member is given
	// when a call has other members to fail over to.
	minAttempt = 250 * time.Millisecond
	// probeTimeout bounds one leader probe.
	probeTimeout = time.Second
	// reconnectWait bounds the wait for a single member's connection to
	// come back before a second attempt (see call).
	reconnectWait = 250 * time.Millisecond
	// downFor is how long a member whose connection failed is not
	// followed as a leader hint: a leader that advertises an address
	// nothing listens on (a wrong --advertise) must not draw every call
	// away from the URL's members, among which it may answer directly.
	downFor = 2 * time.Second
)

// Metadata keys the driver sends. noForwardKey asks a follower to answer
// NOT_LEADER with its hint instead of forwarding the call to the leader
// (HTTP's Dlock-No-Forward); forwardedKey is the mark of a call a follower
// forwarded, which a server never forwards again, sent too so that a server
// that knows only that mark answers the same way.
const (
	noForwardKey = "dlock-no-forward"
	forwardedKey = "dlock-forwarded"
)

// member is one dlockd node, by its API address.
type member struct {
	addr string // host:port; "" for the caller's connection given to New

	// Set once, under cluster.mu, by cluster.client.
	cc     *grpc.ClientConn // owned or shared; nil until first used, or for New's
	shared *sharedConn      // the pool's connection cc is, when shared (connshare.go)
	client dlockv1.LockClient
	waits  *waitConns // the Waits on cc and past it (waitconns.go); nil for New's
}

// cluster is the members a Driver knows and the one it believes leads.
type cluster struct {
	dopts []grpc.DialOption // nil for New: hints to other addresses are not followed
	// share, when not nil, is the key (without address) under which the
	// members' connections are shared with other Drivers (connshare.go);
	// done ends when the cluster closes, and with it every call made on a
	// shared connection.
	share  *connKey
	done   context.Context
	doneFn context.CancelFunc

	mu      sync.Mutex
	members []*member // the URL's, in its order, then those learned from hints
	extra   int       // how many members came from hints
	leader  *member   // believed leader; never nil
	// confirmed: the belief was set by a probe the leader answered itself
	// (it had a quorum then), not by a hint or a demotion.
	confirmed bool
	changed   chan struct{}
	closed    bool
	// down: when each member's connection last failed (cleared when it
	// answers); see downFor.
	down map[*member]downMark
}

// downMark is when a member's connection failed, and whether it was
// refused (nothing listens there).
type downMark struct {
	at      time.Time
	refused bool
}

// newCluster returns the cluster of addrs (at least one, validated and
// distinct), dialled lazily with dopts; with share not nil, on connections
// shared under that key (connshare.go).
func newCluster(addrs []string, dopts []grpc.DialOption, share *connKey) *cluster {
	c := &cluster{dopts: dopts, changed: make(chan struct{}), share: share}
	if share != nil {
		c.done, c.doneFn = context.WithCancel(context.Background())
	}
	for _, a := range addrs {
		c.members = append(c.members, &member{addr: a})
	}
	c.leader = c.members[0]
	return c
}

// newFixedCluster returns the one-member cluster of a caller's connection.
func newFixedCluster(cc grpc.ClientConnInterface) *cluster {
	m := &member{client: dlockv1.NewLockClient(cc)}
	return &cluster{members: []*member{m}, leader: m, changed: make(chan struct{})}
}

// errClosedConn is returned for a member whose connection cannot be made
// because the Driver closed.
var errClosedConn = status.Error(codes.Unavailable, "dlockd: driver closed")

// client returns m's LockClient, dialling m on first use.
func (c *cluster) client(m *member) (dlockv1.LockClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.client != nil {
		return m.client, nil
	}
	if c.closed {
		return nil, errClosedConn
	}
	if c.share != nil {
		key := *c.share
		key.addr = m.addr
		sc, err := getShared(key, c.dopts)
		if err != nil { // the address was validated: not expected
			return nil, status.Errorf(codes.Unavailable, "dlockd: dial %s: %v", m.addr, err)
		}
		m.cc, m.shared, m.client = sc.cc, sc, dlockv1.NewLockClient(driverConn{cc: sc.cc, done: c.done})
		m.waits = sc.waits
		return m.client, nil
	}
	cc, err := grpc.NewClient("passthrough:///"+m.addr, c.dopts...)
	if err != nil { // the address was validated: not expected
		return nil, status.Errorf(codes.Unavailable, "dlockd: dial %s: %v", m.addr, err)
	}
	m.cc, m.client = cc, dlockv1.NewLockClient(cc)
	addr, dopts := m.addr, c.dopts
	m.waits = newWaitConns(cc, func() (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///"+addr, dopts...)
	})
	return m.client, nil
}

// waitClient returns the LockClient for one more Wait stream on m: m's own
// connection while it carries fewer than WaitsPerConn Waits, else one
// dialled for Waits (waitconns.go). done gives the Wait's place back once
// its stream has ended.
func (c *cluster) waitClient(m *member) (client dlockv1.LockClient, done func(), err error) {
	client, err = c.client(m)
	if err != nil {
		return nil, nil, err
	}
	if m.waits == nil { // the caller's connection (New)
		return client, func() {}, nil
	}
	cc, done := m.waits.get()
	switch {
	case cc == m.cc:
		return client, done, nil
	case c.share != nil:
		return dlockv1.NewLockClient(driverConn{cc: cc, done: c.done}), done, nil
	default:
		return dlockv1.NewLockClient(cc), done, nil
	}
}

// close closes every connection the cluster made, and ends its calls on
// shared connections and gives those back (closed by the last Driver).
func (c *cluster) close() error {
	c.mu.Lock()
	c.closed = true
	var ccs []*grpc.ClientConn
	var owned []*waitConns
	var shared []*sharedConn
	for _, m := range c.members {
		switch {
		case m.shared != nil:
			shared = append(shared, m.shared)
		case m.cc != nil:
			ccs = append(ccs, m.cc)
			owned = append(owned, m.waits)
		}
	}
	c.mu.Unlock()
	if c.doneFn != nil {
		c.doneFn()
	}
	var errs []error
	for _, w := range owned {
		errs = append(errs, w.close())
	}
	for _, cc := range ccs {
		errs = append(errs, cc.Close())
	}
	for _, sc := range shared {
		errs = append(errs, putShared(sc))
	}
	return errors.Join(errs...)
}

// size returns how many members the cluster knows.
func (c *cluster) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.members)
}

// current returns the believed leader and the channel that closes when the
// belief changes.
func (c *cluster) current() (*member, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader, c.changed
}

// setLeader makes m the believed leader.
func (c *cluster) setLeader(m *member) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLeaderLocked(m)
}

func (c *cluster) setLeaderLocked(m *member) {
	c.confirmed = false
	if c.leader != m {
		c.leader = m
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// setConfirmed makes m the believed leader, confirmed by m itself.
func (c *cluster) setConfirmed(m *member) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLeaderLocked(m)
	c.confirmed = true
}

// confirmedLeader returns the believed leader when a probe confirmed it,
// else nil.
func (c *cluster) confirmedLeader() *member {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.confirmed {
		return c.leader
	}
	return nil
}

// next returns the member after m, in the cluster's order.
func (c *cluster) next(m *member) *member {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.members {
		if x == m {
			return c.members[(i+1)%len(c.members)]
		}
	}
	return c.members[0]
}

// demote moves the belief away from m (which did not answer) to the next
// member, unless another caller moved it already.
func (c *cluster) demote(m *member) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader != m || len(c.members) < 2 {
		return
	}
	for i, x := range c.members {
		if x == m {
			c.setLeaderLocked(c.members[(i+1)%len(c.members)])
			return
		}
	}
}

// follow makes the member at addr (a leader hint) the believed leader and
// returns it, adding it as a member when it is not one. It returns nil when
// the hint cannot be followed: not a valid host:port, a Driver built on a
// caller's connection (New), or too many members learned from hints.
func (c *cluster) follow(addr string) *member {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.addr != "" && m.addr == addr {
			c.setLeaderLocked(m)
			return m
		}
	}
	if c.dopts == nil || c.extra >= maxExtraMembers || urlparam.Addrs("dlockd", addr, "HOST:PORT", true) != nil || strings.Contains(addr, ",") {
		return nil
	}
	m := &member{addr: addr}
	c.members = append(c.members, m)
	c.extra++
	c.setLeaderLocked(m)
	return m
}

// markDown records that m's connection failed now, with err.
func (c *cluster) markDown(m *member, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down == nil {
		c.down = make(map[*member]downMark)
	}
	c.down[m] = downMark{at: time.Now(), refused: refusedConn(err)}
}

// refusedConn reports whether err is a refused connection.
func refusedConn(err error) bool {
	return strings.Contains(strings.ToLower(status.Convert(err).Message()), "connection refused")
}

// markUp forgets a connection failure of m (it answered).
func (c *cluster) markUp(m *member) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.down, m)
}

// isDown reports whether the member at addr failed to connect within the
// last downFor, and whether that connection was refused.
func (c *cluster) isDown(addr string) (down, refused bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for m, mark := range c.down {
		if m.addr == addr && time.Since(mark.at) < downFor {
			return true, mark.refused
		}
	}
	return false, false
}

// byAddr returns the member at addr, or nil.
func (c *cluster) byAddr(addr string) *member {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.addr != "" && m.addr == addr {
			return m
		}
	}
	return nil
}

// failure is how one attempt failed, as far as leader following goes.
type failure int

const (
	// answered: the server answered (a grant, a refusal, a capacity
	// limit, ...): the call ends with it.
	answered failure = iota
	// notLeader: the node is not the leader (NOT_LEADER); hint, when set
	// and not the node's own address, names the leader's API address.
	notLeader
	// unreachable: the connection failed or the node did not answer in
	// time, or it is shutting down (SHUTTING_DOWN): try another member.
	unreachable
)

// Reason codes of dlockd answers the driver acts on.
const (
	reasonNotLeader    = "NOT_LEADER"
	reasonShuttingDown = "SHUTTING_DOWN"
	reasonDuplicate    = "DUPLICATE_WAIT"
)

// leaderHint returns the leader's API address a NOT_LEADER answer carries
// (status detail errdetails.ErrorInfo, Reason NOT_LEADER, Metadata
// leader_api), and whether err is such an answer at all (by the detail, or
// by the reason code ending its message, as older servers and Session
// answers give it, without a hint).
func leaderHint(err error) (hint string, isNotLeader bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return "", false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == reasonNotLeader {
			return strings.TrimSpace(info.GetMetadata()["leader_api"]), true
		}
	}
	return "", reasonOf(st.Message()) == reasonNotLeader
}

// hintLeaderID returns the leader's node ID a NOT_LEADER answer carries
// (ErrorInfo metadata leader_id), or "".
func hintLeaderID(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == reasonNotLeader {
			return strings.TrimSpace(info.GetMetadata()["leader_id"])
		}
	}
	return ""
}

// leaderUnreachableError is the error of a call that gave up while the
// leader the members named could not be connected to at the API address
// it advertises (its --advertise is wrong, or it is down), and no member
// in the URL answered as the leader. It is UNAVAILABLE to gRPC's status
// functions, and its text names the real cause rather than "no leader".
type leaderUnreachableError struct {
	id, addr string // the leader's node ID ("" when not named) and API address
	refused  bool   // the connection was refused (nothing listens there)
	err      error  // the last attempt's error
}

func (e *leaderUnreachableError) Error() string {
	who := "the leader"
	if e.id != "" {
		who += " " + e.id
	}
	how := "which does not accept connections"
	if e.refused {
		how = "which refuses connections"
	}
	return fmt.Sprintf("%s advertises %s, %s; check its --advertise", who, e.addr, how)
}

// GRPCStatus returns UNAVAILABLE with the error's text.
func (e *leaderUnreachableError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, "dlockd: "+e.Error())
}

// Unwrap returns the last attempt's error.
func (e *leaderUnreachableError) Unwrap() error { return e.err }

// reasonOf returns the reason code ending a dlockd error message
// ("… (NOT_LEADER)"), or "".
func reasonOf(msg string) string {
	if i := strings.LastIndex(msg, " ("); i >= 0 && strings.HasSuffix(msg, ")") {
		if r := msg[i+2 : len(msg)-1]; isReasonCode(r) {
			return r
		}
	}
	return ""
}

// classify says how an attempt on a member failed. attemptEnded reports that
// the attempt's own deadline (not the caller's) cut it.
func classify(err error, attemptEnded bool) (failure, string) {
	if hint, ok := leaderHint(err); ok {
		return notLeader, hint
	}
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.Unavailable:
		if r := reasonOf(st.Message()); r != "" && r != reasonShuttingDown {
			return answered, ""
		}
		if notgrpc.Is(st.Message()) {
			return answered, ""
		}
		return unreachable, ""
	case codes.DeadlineExceeded, codes.Canceled:
		if attemptEnded {
			return unreachable, ""
		}
	}
	// A peer that does not speak dlockd's protocol is a configuration
	// error (mapErr): answered, never failed over to hide it.
	return answered, ""
}

// callOpts are the options of one Driver.call.
type callOpts struct {
	// once: a single attempt (for calls that are not idempotent: a repeat
	// could act twice), except that a call gRPC could not even send (the
	// connection to the member failed) goes to the next member; a hint in
	// its answer only moves the belief for the next call.
	once bool
	// probe: ask the node itself (no forwarding to the leader).
	probe bool
	// start: the member to try first; nil: the believed leader.
	start *member
}

// callResult describes how a call went beyond its error.
type callResult struct {
	// retried: an earlier attempt failed after it may have reached a
	// server, so a later attempt's answer may follow the earlier attempt's
	// effect (see Release).
	retried bool
	// m is the member that gave the last answer.
	m *member
}

// call runs fn on the believed leader and returns its error. When the node
// is not the leader it follows the node's hint at once (an address not in
// the URL becomes a member), at most a few times in a row; when no member
// knows a leader (an election, a self-hint, no hint) it pauses briefly, with
// jitter, and tries the next member; when a member cannot be reached or
// does not answer within its share of the time, it tries the next member at
// once (and after a full round of members, pauses). A hint naming a member
// whose connection failed within downFor (a leader whose --advertise names
// an address nothing listens on) is not followed: the call goes on to the
// next member, as for a member that cannot be reached, so that the leader
// answers directly when the URL lists its real address. It keeps trying
// until ctx ends (or, without a deadline, for the caller's op timeout,
// driver.OpTimeout, or else noDeadlineBudget), and then returns the last
// attempt's error, or a *leaderUnreachableError naming the leader and its
// advertised address when a hint's address could not be connected to. A Driver that knows a single member (one
// dlockd, and no hint named another) makes one attempt, as a plain gRPC
// call would, and follows only a hint to another address: the root package
// retries by its own rules, and a single node that is down is reported at
// once.
//
// fn must be idempotent unless o.once: a retried attempt may follow one
// that took effect on the server but whose answer was lost.
func (d *Driver) call(ctx context.Context, o callOpts, fn func(ctx context.Context, c dlockv1.LockClient) error) (callResult, error) {
	cl := d.cl
	m, _ := cl.current()
	if o.start != nil {
		m = o.start
	}
	var res callResult
	var budgetEnd time.Time
	if dl, ok := ctx.Deadline(); ok {
		budgetEnd = dl
	} else if op := driver.OpTimeout(ctx); op > 0 {
		budgetEnd = time.Now().Add(op)
	} else {
		budgetEnd = time.Now().Add(noDeadlineBudget)
	}
	if o.probe {
		ctx = metadata.AppendToOutgoingContext(ctx, noForwardKey, "1", forwardedKey, "1")
	}
	hops, tried, pauses := 0, 0, 0
	reconnected := false
	// hinted: the leader a hint named when that hint led to m (else
	// nil); bad: a leader a hint named whose advertised address could not
	// be connected to, which the error names when the call gives up.
	var hinted *leaderUnreachableError
	var bad *leaderUnreachableError
	fail := func(err error) (callResult, error) {
		if bad != nil {
			b := *bad
			b.err = err
			return res, &b
		}
		return res, err
	}
	for {
		res.m = m
		client, err := cl.client(m)
		var attemptEnded bool
		if err == nil {
			actx, cancel := d.attemptCtx(ctx, budgetEnd)
			err = fn(actx, client)
			attemptEnded = actx.Err() != nil && ctx.Err() == nil
			cancel()
		}
		if err == nil {
			return res, nil
		}
		kind, hint := classify(err, attemptEnded)
		if kind == answered {
			cl.markUp(m)
			return res, err
		}
		if kind == unreachable && neverSent(err) {
			cl.markDown(m, err)
			if hinted != nil && hinted.addr == m.addr {
				b := *hinted
				b.refused = refusedConn(err)
				bad = &b
			}
		} else {
			cl.markUp(m)
		}
		hinted = nil
		if ctx.Err() != nil {
			return fail(err)
		}
		if attemptEnded {
			cl.demote(m) // frozen or slow: let the next calls start elsewhere
		}
		var next *member
		pause := false
		switch kind {
		case notLeader:
			if down, refused := cl.isDown(hint); down && hint != "" && hint != m.addr {
				// The hint names a leader whose address failed to
				// connect: try the next member (the leader may be among
				// the URL's, and answer there), as for a member that
				// cannot be reached.
				bad = &leaderUnreachableError{id: hintLeaderID(err), addr: hint, refused: refused}
				tried++
				next = cl.next(m)
				if tried >= cl.size() {
					pause, tried = true, 0
				}
				break
			}
			if hint != "" && hint != m.addr {
				next = cl.follow(hint)
				if next != nil {
					hinted = &leaderUnreachableError{id: hintLeaderID(err), addr: hint}
				}
			}
			if next == nil || hops >= 2*cl.size()+2 {
				// No usable hint (an election, a node that believes it
				// leads but is not ready), or hints that go round in
				// circles: the next member, after a pause.
				next, pause, hops = cl.next(m), true, 0
			} else {
				hops++
			}
		case unreachable:
			if cl.size() == 1 {
				// One member: one attempt (the root package retries),
				// except that a failure reported from gRPC's reconnect
				// backoff (an earlier connection failure: the server may
				// be back by now) is tried once more, after waking the
				// connection up; a server that is still down refuses
				// that at once too.
				if !reconnected && m.cc != nil && m.cc.GetState() == connectivity.TransientFailure && (!o.once || neverSent(err)) {
					reconnected = true
					res.retried = res.retried || !neverSent(err)
					m.cc.ResetConnectBackoff()
					wctx, cancel := context.WithTimeout(ctx, reconnectWait)
					m.cc.WaitForStateChange(wctx, connectivity.TransientFailure)
					cancel()
					continue
				}
				return fail(err)
			}
			tried++
			next = cl.next(m)
			if tried >= cl.size() {
				pause, tried = true, 0
			}
		}
		if o.once && !neverSent(err) {
			if (kind == notLeader && pause) || kind == unreachable {
				cl.demote(m) // no hint, or gone: let the next call ask another member
			}
			return fail(err)
		}
		if pause && cl.size() == 1 {
			return fail(err) // one member and no leader known: as above
		}
		res.retried = true
		if pause {
			wait := jitter(pauses)
			pauses++
			if left := time.Until(budgetEnd); left <= wait {
				// No time for another attempt: the call's time is its
				// wait for a leader; end it at its deadline.
				sleepCtx(ctx, left)
				return fail(err)
			}
			if !sleepCtx(ctx, wait) {
				return fail(err)
			}
		} else if !time.Now().Before(budgetEnd) {
			return fail(err)
		}
		m = next
	}
}

// neverSent reports whether err proves that the call never left the client:
// gRPC could not set up a connection to the member (the dial failed, or
// the peer closed the connection before its HTTP/2 preface, as a proxy in
// front of a dead node does), and a call is sent only on a connection that
// is ready; so even a call that is not idempotent may be sent elsewhere.
func neverSent(err error) bool {
	st, _ := status.FromError(err)
	if st.Code() != codes.Unavailable {
		return false
	}
	msg := st.Message()
	return strings.Contains(msg, "Error while dialing") || strings.Contains(msg, "error reading server preface")
}

// attemptCtx bounds one attempt: with other members to try, at most half
// the time left (at least minAttempt), so that a frozen leader leaves time
// for a second attempt elsewhere; with one member, the call's whole time.
func (d *Driver) attemptCtx(ctx context.Context, budgetEnd time.Time) (context.Context, context.CancelFunc) {
	left := time.Until(budgetEnd)
	if d.cl.size() < 2 {
		if _, ok := ctx.Deadline(); ok {
			return ctx, func() {}
		}
		return context.WithTimeout(ctx, left)
	}
	return context.WithTimeout(ctx, max(left/2, min(minAttempt, left)))
}

// jitter returns the pause before the n-th (from 0) retry of a round with
// no leader: full jitter over a ceiling doubling from pauseMin to pauseMax,
// never under pauseMin/2.
func jitter(n int) time.Duration {
	ceiling := pauseMax
	if n < 8 {
		ceiling = min(pauseMax, pauseMin<<n)
	}
	return pauseMin/2 + rand.N(ceiling)
}

// sleepCtx sleeps for d, or returns false when ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// probeLeader asks the believed leader (itself, not forwarding) whether it
// leads, with an empty renewal, which a node answers only while a quorum
// follows it; it follows hints and fails over as call does, within
// probeTimeout, and leaves the belief on the node that confirmed. It
// returns that member, or nil when no member confirmed in time.
func (d *Driver) probeLeader(ctx context.Context) *member {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	res, err := d.call(pctx, callOpts{probe: true}, func(ctx context.Context, c dlockv1.LockClient) error {
		_, err := c.Renew(ctx, &dlockv1.RenewRequest{})
		return err
	})
	if err != nil {
		return nil
	}
	d.cl.setConfirmed(res.m)
	return res.m
}

// confirmsLeader reports whether m itself (not forwarding) answers that it
// leads, within probeTimeout: one empty renewal, no retry.
func (d *Driver) confirmsLeader(ctx context.Context, m *member) bool {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	_, err := d.call(pctx, callOpts{probe: true, once: true, start: m}, func(ctx context.Context, c dlockv1.LockClient) error {
		_, err := c.Renew(ctx, &dlockv1.RenewRequest{})
		return err
	})
	return err == nil
}
