package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Full method names under which Session calls are counted, as their unary
// twins.
const (
	methodAcquire = "/dlock.v1.Lock/Acquire"
	methodRelease = "/dlock.v1.Lock/Release"
	methodRenew   = "/dlock.v1.Lock/Renew"
)

// callPool runs Session calls on goroutines that stay alive (and keep their
// grown stacks) between calls, as grpc.NumStreamWorkers does for RPCs.
// When every worker is busy a call starts a new worker, which runs it at
// once (a slow call never delays another) and then stays for more calls
// until it has been idle for callWorkerIdle; past maxCallWorkers a call
// gets a goroutine of its own that ends with it. So a load of n concurrent
// calls keeps about n workers, where one-off goroutines would each start
// with a small stack and grow it again (a copy per growth: 4% of dlockd's
// CPU at 64 clients before, issue 11).
// The workers end when stop closes.
type callPool struct {
	ch      chan func()
	stop    <-chan struct{}
	workers atomic.Int32 // alive, the permanent ones included
}

// callWorkerIdle is how long a worker started for a busy moment waits for
// another call before it ends.
const callWorkerIdle = 2 * time.Second

// maxCallWorkers bounds the workers: a burst beyond them runs its calls on
// goroutines that end with them.
const maxCallWorkers = 512

func newCallPool(workers int, stop <-chan struct{}) *callPool {
	p := &callPool{ch: make(chan func()), stop: stop}
	p.workers.Store(int32(workers))
	for range workers {
		go p.work(nil, false)
	}
	return p
}

// work runs first (when not nil), then calls from the pool until stop
// closes, or, for a worker started for a busy moment (temporary), until it
// has waited callWorkerIdle for one.
func (p *callPool) work(first func(), temporary bool) {
	if first != nil {
		first()
	}
	var idle <-chan time.Time
	var t *time.Timer
	if temporary {
		t = time.NewTimer(callWorkerIdle)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case f := <-p.ch:
			f()
			if t != nil {
				t.Reset(callWorkerIdle)
			}
		case <-idle:
			p.workers.Add(-1)
			return
		case <-p.stop:
			return
		}
	}
}

func (p *callPool) run(f func()) {
	select {
	case p.ch <- f:
		return
	default:
	}
	if p.workers.Add(1) <= maxCallWorkers {
		go p.work(f, true)
		return
	}
	p.workers.Add(-1)
	go f()
}

// do runs f as run does and returns when f has returned: a caller whose
// goroutine will then park for long (a waiting request) runs its deep calls
// on a worker's grown stack and keeps its own small. A panic of f is
// raised again in the caller's goroutine, as a workerPanic carrying f's
// stack, so that the caller's recovery (recover.go) answers and logs it.
func (p *callPool) do(f func()) {
	done := make(chan struct{})
	var wp *workerPanic
	p.run(func() {
		defer close(done)
		defer func() {
			if v := recover(); v != nil {
				wp = &workerPanic{value: v, stack: debug.Stack()}
			}
		}()
		f()
	})
	<-done
	if wp != nil {
		panic(wp)
	}
}

// workerPanic is a panic of a function that callPool.do ran on a worker,
// raised again in do's caller, with the stack of the worker where it
// happened.
type workerPanic struct {
	value any
	stack []byte
}

// sessionStream is the state of one Session stream.
//
// Backpressure: a call takes a slot before it is read and gives it back when
// its answer is sent, so at most Config.MaxInflightPerStream calls of one
// stream are running or waiting to be sent. Once read, and before it runs,
// a call also takes its weight (its request's size, at least
// minCallWeight) from the stream's byte budget
// (MaxInflightBytesPerStream) and then from the node's (MaxInflightBytes),
// and gives it back when its answer is sent. When every slot is taken, or
// the next call's bytes do not fit, the stream is not read; its unread
// calls stay in the client's buffers, bounded by HTTP/2 flow control. So
// the node holds at most MaxInflightBytes of calls (and their answers) plus
// one waiting call, at most MaxRequestBytes, per stream. One goroutine
// sends the answers, so a client that does not read them blocks that
// goroutine only, never the calls' workers.
type sessionStream struct {
	a      *api
	stream dlockv1.Lock_SessionServer

	slots chan struct{}      // one per call in flight; capacity MaxInflightPerStream
	out   chan sessionAnswer // answers to send; capacity MaxInflightPerStream
	bytes *byteBudget        // bytes of the calls in flight; MaxInflightBytesPerStream
	pace  callPacer          // MaxSessionCallRate

	mu      sync.Mutex
	stopped bool
	// running holds the ids of the calls running: the cancel function of
	// an acquisition, nil for another call.
	running map[uint64]context.CancelFunc
	wg      sync.WaitGroup
}

// sessionAnswer is an answer to send and the weight its call took from the
// byte budgets.
type sessionAnswer struct {
	resp   *dlockv1.SessionResponse
	weight int64
}

// minCallWeight is the least weight of a Session call in the byte budgets:
// a tiny call still costs a goroutine, a context and an answer.
const minCallWeight = 1024

// Session implements dlockv1.LockServer: see the proto.
//
// A node that is not the leader ends the stream at once with NOT_LEADER and
// the leader hint (streams are not forwarded; the client's unary calls
// are): the client opens it again at the leader. On a stream opened at the
// leader, a call made after it lost the leadership is answered NOT_LEADER
// on its own.
func (a *api) Session(stream dlockv1.Lock_SessionServer) error {
	if err := a.s.writable(); err != nil {
		return err
	}
	n := a.s.cfg.MaxInflightPerStream
	ss := &sessionStream{
		a: a, stream: stream, running: make(map[uint64]context.CancelFunc),
		slots: make(chan struct{}, n), out: make(chan sessionAnswer, n),
		bytes: newByteBudget(int64(a.s.cfg.MaxInflightBytesPerStream)),
		pace:  newCallPacer(a.s.cfg.MaxSessionCallRate),
	}
	sent := make(chan struct{})
	go ss.sendLoop(sent)
	recvErr := make(chan error, 1)
	go func() { recvErr <- ss.recvLoop() }()
	var err error
	select {
	case err = <-recvErr:
	case <-a.s.closing:
		err = status.Error(codes.Unavailable, "dlockd: shutting down (SHUTTING_DOWN)")
	}
	// Let the running calls answer; no new call starts.
	ss.mu.Lock()
	ss.stopped = true
	ss.mu.Unlock()
	ss.wg.Wait()
	close(ss.out)
	<-sent
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// sendLoop sends the answers until out is closed, giving each call's slot
// and bytes back once its answer is sent. After a failed send it drops the
// rest (the stream is broken) but still gives their slots and bytes back.
func (ss *sessionStream) sendLoop(done chan<- struct{}) {
	defer close(done)
	broken := false
	for ans := range ss.out {
		if !broken && ss.stream.Send(ans.resp) != nil {
			broken = true
		}
		ans.resp = nil
		ss.giveBytes(ans.weight)
		<-ss.slots
	}
}

// takeBytes waits until a call of weight bytes fits in the stream's byte
// budget and then in the node's, and takes it from both. It returns an
// error, having taken nothing, when the stream or the server ends first.
func (ss *sessionStream) takeBytes(ctx context.Context, weight int64) error {
	lim := ss.a.s.limits()
	if !ss.bytes.tryTake(weight) {
		lim.refused(limitSessionInflightBytes, fmt.Sprintf("a Session stream's next call of %d bytes does not fit in the %d bytes it may have in flight; not reading it until answers are sent", weight, ss.bytes.size))
		if !ss.bytes.take(weight, ctx.Done(), ss.a.s.closing) {
			return ss.ended(ctx)
		}
	}
	if !lim.inflight.tryTake(weight) {
		lim.refused(limitInflightBytes, fmt.Sprintf("a Session call of %d bytes does not fit in the %d bytes of calls this node may have in flight; not reading its stream until answers are sent", weight, lim.inflight.size))
		if !lim.inflight.take(weight, ctx.Done(), ss.a.s.closing) {
			ss.bytes.give(weight)
			return ss.ended(ctx)
		}
	}
	return nil
}

// giveBytes gives back what takeBytes took.
func (ss *sessionStream) giveBytes(weight int64) {
	ss.a.s.limits().inflight.give(weight)
	ss.bytes.give(weight)
}

// ended is the error of a wait abandoned because the stream (ctx) or the
// server ended.
func (ss *sessionStream) ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	return io.EOF
}

// callPacer spaces out the calls of one Session stream to a rate: at most
// burst calls per window, burst = rate/1000 (at least 1) and window =
// burst/rate (at least a millisecond), so that a pipelining client's
// calls arrive smoothly rather than in bursts of a whole window. Used by
// the stream's read loop only: no lock.
type callPacer struct {
	burst  int
	window time.Duration
	n      int       // calls read in the current window
	start  time.Time // the current window's start
	why    string    // what the limit's log line says
}

// newCallPacer returns the pacer of rate calls per second (0: none).
func newCallPacer(rate int) callPacer {
	if rate <= 0 {
		return callPacer{}
	}
	burst := max(rate/1000, 1)
	window := max(time.Second*time.Duration(burst)/time.Duration(rate), time.Millisecond)
	return callPacer{burst: burst, window: window,
		why: fmt.Sprintf("a Session stream makes calls faster than %d per %v; reading it more slowly", burst, window)}
}

// wait returns once the next call may be read, counting limit
// "session_rate" when it had to wait; an error when the stream (ctx) or
// the server (closing) ends first.
func (p *callPacer) wait(ctx context.Context, closing <-chan struct{}, lim *limits) error {
	if p.burst == 0 {
		return nil
	}
	if p.n < p.burst {
		if p.n == 0 {
			p.start = time.Now()
		}
		p.n++
		return nil
	}
	if d := time.Until(p.start.Add(p.window)); d > 0 {
		lim.refused(limitSessionRate, p.why)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-closing:
			t.Stop()
			return io.EOF
		}
	}
	p.start, p.n = time.Now(), 1
	return nil
}

// takeSlot waits for a free slot before the next call is read. It returns
// an error when the stream or the server ends first.
func (ss *sessionStream) takeSlot(ctx context.Context) error {
	select {
	case ss.slots <- struct{}{}:
		return nil
	default:
	}
	// Every slot is taken: stop reading until an answer is sent.
	ss.a.s.limits().refused(limitSessionInflight, fmt.Sprintf("a Session stream has %d calls in flight; not reading it until one is answered", cap(ss.slots)))
	select {
	case ss.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-ss.a.s.closing:
		return io.EOF
	}
}

func (ss *sessionStream) recvLoop() error {
	ctx := ss.stream.Context()
	for {
		if err := ss.pace.wait(ctx, ss.a.s.closing, ss.a.s.limits()); err != nil {
			return err
		}
		if err := ss.takeSlot(ctx); err != nil {
			return err
		}
		req, err := ss.stream.Recv()
		if err != nil {
			<-ss.slots
			return err
		}
		id := req.GetId()
		// Only cancel: true cancels; cancel: false is an empty call,
		// answered INVALID_ARGUMENT by call.
		if c, ok := req.GetCall().(*dlockv1.SessionRequest_Cancel); ok && c.Cancel {
			<-ss.slots // a cancel is not answered
			ss.mu.Lock()
			if cancel := ss.running[id]; cancel != nil {
				cancel()
			}
			ss.mu.Unlock()
			continue
		}
		weight := max(int64(proto.Size(req)), minCallWeight)
		if err := ss.takeBytes(ctx, weight); err != nil {
			<-ss.slots
			return err
		}
		ss.mu.Lock()
		if ss.stopped {
			ss.mu.Unlock()
			ss.giveBytes(weight)
			<-ss.slots
			return io.EOF
		}
		if _, busy := ss.running[id]; busy {
			// Answered without running: two calls with one id could
			// not be told apart, nor cancelled one at a time. Sent
			// under mu, before stopped is set: out is not closed yet,
			// and has room for every slot.
			ss.out <- sessionAnswer{ss.refuseBusyID(req), weight}
			ss.mu.Unlock()
			continue
		}
		cctx := ctx
		var cancel context.CancelFunc
		if _, ok := req.GetCall().(*dlockv1.SessionRequest_Acquire); ok {
			cctx, cancel = context.WithCancel(ctx)
		}
		ss.running[id] = cancel
		ss.wg.Add(1)
		ss.mu.Unlock()
		ss.a.s.calls.run(func() {
			defer ss.wg.Done()
			resp := ss.safeCall(cctx, req)
			ss.mu.Lock()
			delete(ss.running, id)
			ss.mu.Unlock()
			if cancel != nil {
				cancel()
			}
			ss.out <- sessionAnswer{resp, weight} // never blocks: out has room for every slot
		})
	}
}

// refuseBusyID answers req, whose id is that of a call still running,
// INVALID_ARGUMENT without running it, counted as its method.
func (ss *sessionStream) refuseBusyID(req *dlockv1.SessionRequest) *dlockv1.SessionResponse {
	start := time.Now()
	err := apiErr(codes.InvalidArgument, ReasonInvalidRequest, "session: id %d is in use by a running call", req.GetId())
	ss.a.s.requestDone(transportSession, sessionMethod(req), keyOf(req), err, start)
	st := status.Convert(err)
	return &dlockv1.SessionResponse{Id: req.GetId(), Code: int32(st.Code()), Message: st.Message()}
}

// sessionMethod is the full method name under which a Session call is
// counted: its unary twin's, or Session's for an empty call.
func sessionMethod(req *dlockv1.SessionRequest) string {
	switch req.GetCall().(type) {
	case *dlockv1.SessionRequest_Acquire:
		return methodAcquire
	case *dlockv1.SessionRequest_Release:
		return methodRelease
	case *dlockv1.SessionRequest_Renew:
		return methodRenew
	}
	return dlockv1.Lock_Session_FullMethodName
}

// safeCall is call, with a panic answered INTERNAL (see recover.go).
func (ss *sessionStream) safeCall(ctx context.Context, req *dlockv1.SessionRequest) (resp *dlockv1.SessionResponse) {
	defer func() {
		if p := recover(); p != nil {
			st := status.Convert(ss.a.s.recovered("Session call", p))
			resp = &dlockv1.SessionResponse{Id: req.GetId(), Code: int32(st.Code()), Message: st.Message()}
		}
	}()
	callPanicHook("Session call")
	return ss.call(ctx, req)
}

// call runs one call as its unary RPC would, and counts, times and logs it
// likewise.
func (ss *sessionStream) call(ctx context.Context, req *dlockv1.SessionRequest) *dlockv1.SessionResponse {
	start := time.Now()
	a := ss.a
	resp := &dlockv1.SessionResponse{Id: req.GetId()}
	var err error
	var method string
	switch c := req.GetCall().(type) {
	case *dlockv1.SessionRequest_Acquire:
		method = methodAcquire
		if c.Acquire.GetWait() {
			err = apiErr(codes.InvalidArgument, ReasonInvalidRequest, "session: acquire with wait: use Wait")
			break
		}
		var r *dlockv1.AcquireResponse
		if r, err = a.Acquire(ctx, c.Acquire); err == nil {
			resp.Result = &dlockv1.SessionResponse_Acquire{Acquire: r}
		}
	case *dlockv1.SessionRequest_Release:
		method = methodRelease
		var r *dlockv1.ReleaseResponse
		if r, err = a.Release(ctx, c.Release); err == nil {
			resp.Result = &dlockv1.SessionResponse_Release{Release: r}
		}
	case *dlockv1.SessionRequest_Renew:
		method = methodRenew
		var r *dlockv1.RenewResponse
		if r, err = a.Renew(ctx, c.Renew); err == nil {
			resp.Result = &dlockv1.SessionResponse_Renew{Renew: r}
		}
	default:
		method = "/dlock.v1.Lock/Session"
		err = apiErr(codes.InvalidArgument, ReasonInvalidRequest, "session: empty call")
	}
	a.s.requestDone(transportSession, method, keyOf(req), err, start)
	if err != nil {
		st := status.Convert(err)
		resp.Code = int32(st.Code())
		resp.Message = st.Message()
	}
	return resp
}
