package dlockddriver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// newSession returns a 128-bit random session ID, hex-encoded.
func newSession() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// callStream is one Session stream: the Driver's Acquire (without wait),
// Release and Renew calls share it, matched by id, instead of each opening
// an HTTP/2 stream of its own. It is open on one member, the leader when it
// was opened.
type callStream struct {
	stream dlockv1.Lock_SessionClient
	m      *member
	cancel context.CancelFunc // ends the stream

	sendMu sync.Mutex

	mu       sync.Mutex
	nextID   uint64
	pending  map[uint64]chan *dlockv1.SessionResponse
	answered bool  // the server answered at least one call
	err      error // why the stream ended; set once
}

// invoke runs req on the Driver's Session stream and returns its response,
// or a gRPC status error as the unary RPC would. fallback reports that the
// stream could not run the call (there is no stream: not yet open, broken,
// an older server; the stream broke under the call; or its node is no
// longer the leader): the caller then runs the unary RPC, which follows the
// leader. sent reports that the call may have reached the server before the
// stream failed it (its effect is unknown).
func (d *Driver) invoke(ctx context.Context, req *dlockv1.SessionRequest) (resp *dlockv1.SessionResponse, fallback, sent bool, err error) {
	cs := d.calls.Load()
	if cs == nil {
		return nil, true, false, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, false, false, status.FromContextError(err).Err()
	}
	ch := make(chan *dlockv1.SessionResponse, 1)
	cs.mu.Lock()
	if cs.err != nil {
		cs.mu.Unlock()
		return nil, true, false, nil
	}
	cs.nextID++
	id := cs.nextID
	req.Id = id
	cs.pending[id] = ch
	cs.mu.Unlock()

	cs.sendMu.Lock()
	err = cs.stream.Send(req)
	cs.sendMu.Unlock()
	if err != nil {
		cs.mu.Lock()
		delete(cs.pending, id)
		cs.mu.Unlock()
		d.dropStream(cs)
		return nil, true, true, nil
	}
	select {
	case resp = <-ch:
	case <-ctx.Done():
		cs.mu.Lock()
		_, running := cs.pending[id]
		delete(cs.pending, id)
		cs.mu.Unlock()
		if !running { // answered meanwhile: the outcome is known, report it
			resp = <-ch
			break
		}
		// Tell the server, as a unary call's cancellation would.
		cs.sendMu.Lock()
		_ = cs.stream.Send(&dlockv1.SessionRequest{Id: id, Call: &dlockv1.SessionRequest_Cancel{Cancel: true}})
		cs.sendMu.Unlock()
		return nil, false, true, status.FromContextError(ctx.Err()).Err()
	}
	if resp == nil { // the stream ended under the call
		cs.mu.Lock()
		err, answered := cs.err, cs.answered
		cs.mu.Unlock()
		if status.Code(err) == codes.Unimplemented { // an older server ran nothing
			return nil, true, false, nil
		}
		if _, notLeader := leaderHint(err); notLeader && !answered {
			// Refused at the start by a node that does not lead: it read
			// no call.
			return nil, true, false, nil
		}
		return nil, true, true, nil
	}
	if resp.GetCode() != 0 {
		err := status.Error(codes.Code(resp.GetCode()), resp.GetMessage())
		if _, notLeader := leaderHint(err); notLeader {
			// The node lost leadership since the stream opened: move the
			// stream, and let the unary RPC find the leader.
			d.cl.demote(cs.m)
			d.dropStream(cs)
			return nil, true, true, nil
		}
		return nil, false, true, err
	}
	return resp, false, true, nil
}

// dropStream stops the Driver from using cs and ends it; the Session loop
// opens another.
func (d *Driver) dropStream(cs *callStream) {
	d.calls.CompareAndSwap(cs, nil)
	cs.cancel()
}

// recvLoop delivers responses until the stream ends, then fails the calls
// still running on it.
func (cs *callStream) recvLoop() error {
	for {
		resp, err := cs.stream.Recv()
		if err != nil {
			cs.mu.Lock()
			cs.err = err
			for id, ch := range cs.pending {
				close(ch)
				delete(cs.pending, id)
			}
			cs.mu.Unlock()
			return err
		}
		cs.mu.Lock()
		cs.answered = true
		if ch := cs.pending[resp.GetId()]; ch != nil {
			delete(cs.pending, resp.GetId())
			ch <- resp
		}
		cs.mu.Unlock()
	}
}

// Probe intervals of the Session loop, with more than one member: how
// often it asks the member its stream is on whether it still leads. While a
// Wait is queued the probe runs more often, so that the wait re-attaches to
// a new leader well within the server's grace (the waiter's TTL).
const (
	probeIdle    = 2 * time.Second
	probeWaiting = 250 * time.Millisecond
)

// sessionLoop keeps the Driver's Session stream open on the leader until
// Close. While it is down, calls use the unary RPCs. With more than one
// member it first finds the leader (probeLeader), reopens the stream when
// the belief moves to another member, and probes the stream's member now
// and then, which is how a Driver whose calls a follower forwards still
// learns where the leader is (and how a queued Wait learns of a new
// leader). A server without Session (an older dlockd) ends the loop: unary
// RPCs only.
func (d *Driver) sessionLoop() {
	defer d.watchWG.Done()
	ctx := d.watchCtx
	delay := 50 * time.Millisecond
	// kickFloor: the least pause a unary write's success may cut a pause
	// short to (pauseSession): sessionRetryFloor, doubled by each pause so
	// cut since a stream last answered a call or stayed open a second, so
	// that a server that keeps refusing the stream while its unary writes
	// succeed is asked about as often as the backoff alone would ask it.
	kickFloor := sessionRetryFloor
	for ctx.Err() == nil {
		m, changed := d.cl.current()
		if d.cl.size() > 1 {
			if p := d.probeLeader(ctx); p != nil {
				m, changed = d.cl.current()
			}
		}
		var err error
		var client dlockv1.LockClient
		start := time.Now()
		accepted := false // the server answered a call on this attempt's stream
		// A success before this attempt says nothing of its outcome.
		select {
		case <-d.sessionKick:
		default:
		}
		if client, err = d.cl.client(m); err == nil {
			sctx, cancel := context.WithCancel(ctx)
			var stream dlockv1.Lock_SessionClient
			stream, err = client.Session(sctx, waitForOne(d.cl)...)
			if err == nil {
				cs := &callStream{stream: stream, m: m, cancel: cancel, pending: make(map[uint64]chan *dlockv1.SessionResponse)}
				d.calls.Store(cs)
				ended := make(chan error, 1)
				go func() { ended <- cs.recvLoop() }()
				err = d.watchStream(ctx, cs, changed, ended)
				d.dropStream(cs)
				cs.mu.Lock()
				accepted = cs.answered
				cs.mu.Unlock()
			}
			cancel()
		}
		if status.Code(err) == codes.Unimplemented {
			return
		}
		elsewhere := false // a follower named a leader the Driver could not follow
		if hint, ok := leaderHint(err); ok && hint != "" && hint != m.addr {
			if d.cl.follow(hint) != nil {
				continue // refused at the start by a follower: go to its leader now
			}
			elsewhere = true
		}
		if accepted || time.Since(start) > time.Second {
			delay = 50 * time.Millisecond
			kickFloor = sessionRetryFloor
		}
		// kickable: whether a unary write's success says the next attempt
		// may be accepted. Not when the leader is elsewhere: writes succeed
		// through the follower's forwarding, its streams never will.
		kickable := !elsewhere
		switch status.Code(err) {
		case codes.Unauthenticated, codes.PermissionDenied:
			// The token was refused (revoked by a reload of the auth
			// file?): retrying every 2 s would only fill the server's
			// audit log. Calls meanwhile use the unary RPCs, whose own
			// refusals end the leases (the root package's heartbeat).
			delay = authRetryDelay
			kickable = false
		case codes.ResourceExhausted: // the server's stream limits: no sooner than the backoff
			kickable = false
		}
		ok, kicked := d.pauseSession(ctx, delay, kickFloor, kickable)
		if !ok {
			return
		}
		if kicked {
			kickFloor *= 2
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// authRetryDelay is how long the Session loop waits before it opens the
// stream again after the server refused the Driver's credentials.
const authRetryDelay = 30 * time.Second

// sessionRetryFloor is the least pause of the Session loop between two
// attempts to open the stream when a unary write's success cuts the pause
// short (pauseSession), while the stream has not stayed open since.
const sessionRetryFloor = 100 * time.Millisecond

// unaryWrote tells the Session loop, never blocking, that a write (an
// acquisition, renewal or release) just succeeded as a unary RPC because
// the Driver had no Session stream: the leader answers writes again, so
// it would accept the stream (pauseSession). Only writes: a read (a fence
// check, an inspection) is answered by a node that does not lead yet.
func (d *Driver) unaryWrote() {
	if d.noSession {
		return
	}
	select {
	case d.sessionKick <- struct{}{}:
	default:
	}
}

// pauseSession waits delay (the loop's backoff, 50 ms doubling to 2 s)
// before the Session loop opens its stream again; ok is false when ctx
// ended first, kicked true when a kick ended the pause. When kickable, a
// unary write that succeeds meanwhile (unaryWrote) ends the pause, though
// not before floor: the leader answers writes again, so the stream is
// opened now rather than up to 2 s later. The stream is refused while a
// server is not yet the leader (a dlockd just started, an election), and
// every call meanwhile took the unary path, which costs about 2.7 times
// the CPU per lock cycle.
func (d *Driver) pauseSession(ctx context.Context, delay, floor time.Duration, kickable bool) (ok, kicked bool) {
	if !kickable || delay <= floor {
		return sleepCtx(ctx, delay), false
	}
	if !sleepCtx(ctx, floor) {
		return false, false
	}
	t := time.NewTimer(delay - floor)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, false
	case <-t.C:
		return true, false
	case <-d.sessionKick:
		return true, true
	}
}

// watchStream waits until the Session stream cs ends (its error), the
// belief moves away from its member (nil), or a probe finds its member no
// longer leads (nil). It returns when ctx ends too.
func (d *Driver) watchStream(ctx context.Context, cs *callStream, changed <-chan struct{}, ended <-chan error) error {
	for {
		every := probeIdle
		if d.waiting.Load() > 0 {
			every = probeWaiting
		}
		t := time.NewTimer(every)
		select {
		case <-d.waitStarted: // probe more often from now on
			t.Stop()
			continue
		case err := <-ended:
			t.Stop()
			return err
		case <-ctx.Done():
			t.Stop()
			cs.cancel()
			return <-ended
		case <-changed:
			t.Stop()
			if m, _ := d.cl.current(); m != cs.m {
				d.dropStream(cs)
				<-ended
				return nil
			}
		case <-t.C:
			if d.cl.size() < 2 {
				continue
			}
			if p := d.probeLeader(ctx); p != cs.m {
				d.dropStream(cs)
				<-ended
				return nil
			}
		}
		_, changed = d.cl.current()
	}
}

// waitForOne returns the call options of a Driver's own streams: with a
// single member, wait for its connection (gRPC's WaitForReady: the stream
// opens as soon as the server is back); with several, fail fast, so that
// the loop can try another member.
func waitForOne(cl *cluster) []grpc.CallOption {
	if cl.size() == 1 {
		return []grpc.CallOption{grpc.WaitForReady(true)}
	}
	return nil
}
