package server

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
// grown stacks) between calls, as grpc.NumStreamWorkers does for RPCs. When
// every worker is busy a call gets a goroutine of its own, so a slow call
// never delays another.
// The workers end when stop closes.
type callPool struct{ ch chan func() }

func newCallPool(workers int, stop <-chan struct{}) *callPool {
	p := &callPool{ch: make(chan func())}
	for range workers {
		go p.work(stop)
	}
	return p
}

func (p *callPool) work(stop <-chan struct{}) {
	for {
		select {
		case f := <-p.ch:
			f()
		case <-stop:
			return
		}
	}
}

func (p *callPool) run(f func()) {
	select {
	case p.ch <- f:
	default:
		go f()
	}
}

// sessionStream is the state of one Session stream.
type sessionStream struct {
	a      *api
	stream dlockv1.Lock_SessionServer

	sendMu sync.Mutex

	mu      sync.Mutex
	stopped bool
	running map[uint64]context.CancelFunc // acquisitions that can be cancelled
	wg      sync.WaitGroup
}

// Session implements dlockv1.LockServer: see the proto.
func (a *api) Session(stream dlockv1.Lock_SessionServer) error {
	ss := &sessionStream{a: a, stream: stream, running: make(map[uint64]context.CancelFunc)}
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
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func (ss *sessionStream) recvLoop() error {
	ctx := ss.stream.Context()
	for {
		req, err := ss.stream.Recv()
		if err != nil {
			return err
		}
		id := req.GetId()
		if _, ok := req.GetCall().(*dlockv1.SessionRequest_Cancel); ok {
			ss.mu.Lock()
			if cancel := ss.running[id]; cancel != nil {
				cancel()
			}
			ss.mu.Unlock()
			continue
		}
		ss.mu.Lock()
		if ss.stopped {
			ss.mu.Unlock()
			return io.EOF
		}
		var cctx context.Context
		var cancel context.CancelFunc
		if _, ok := req.GetCall().(*dlockv1.SessionRequest_Acquire); ok {
			cctx, cancel = context.WithCancel(ctx)
			ss.running[id] = cancel
		}
		ss.wg.Add(1)
		ss.mu.Unlock()
		ss.a.s.calls.run(func() {
			defer ss.wg.Done()
			resp := ss.call(cctx, req)
			if cancel != nil {
				ss.mu.Lock()
				delete(ss.running, id)
				ss.mu.Unlock()
				cancel()
			}
			ss.sendMu.Lock()
			_ = ss.stream.Send(resp)
			ss.sendMu.Unlock()
		})
	}
}

// call runs one call as its unary RPC would, and counts it likewise.
func (ss *sessionStream) call(ctx context.Context, req *dlockv1.SessionRequest) *dlockv1.SessionResponse {
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
	a.s.metrics.count(method, err)
	if err != nil {
		st := status.Convert(err)
		resp.Code = int32(st.Code())
		resp.Message = st.Message()
	}
	return resp
}
