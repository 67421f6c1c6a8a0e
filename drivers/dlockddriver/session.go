package dlockddriver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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
// an HTTP/2 stream of its own.
type callStream struct {
	stream dlockv1.Lock_SessionClient

	sendMu sync.Mutex

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan *dlockv1.SessionResponse
	err     error // why the stream ended; set once
}

// errNoStream tells invoke's caller to use the unary RPC.
var errNoStream = errors.New("dlockd: no session stream")

// invoke runs req on the Driver's Session stream and returns its response,
// or a gRPC status error as the unary RPC would. It returns errNoStream
// when there is no stream (not yet open, broken, or an old server): the
// caller then uses the unary RPC, and nothing was sent.
func (d *Driver) invoke(ctx context.Context, req *dlockv1.SessionRequest) (*dlockv1.SessionResponse, error) {
	cs := d.calls.Load()
	if cs == nil {
		return nil, errNoStream
	}
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	ch := make(chan *dlockv1.SessionResponse, 1)
	cs.mu.Lock()
	if cs.err != nil {
		cs.mu.Unlock()
		return nil, errNoStream
	}
	cs.nextID++
	id := cs.nextID
	req.Id = id
	cs.pending[id] = ch
	cs.mu.Unlock()

	cs.sendMu.Lock()
	err := cs.stream.Send(req)
	cs.sendMu.Unlock()
	if err != nil {
		cs.mu.Lock()
		delete(cs.pending, id)
		cs.mu.Unlock()
		return nil, status.Errorf(codes.Unavailable, "dlockd: session stream: %v", err)
	}
	var resp *dlockv1.SessionResponse
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
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if resp == nil { // the stream ended
		cs.mu.Lock()
		err := cs.err
		cs.mu.Unlock()
		if status.Code(err) == codes.Unimplemented { // an older server ran nothing
			return nil, errNoStream
		}
		if _, ok := status.FromError(err); !ok || status.Code(err) == codes.OK {
			err = status.Errorf(codes.Unavailable, "dlockd: session stream: %v", err)
		}
		return nil, err
	}
	if resp.GetCode() != 0 {
		return nil, status.Error(codes.Code(resp.GetCode()), resp.GetMessage())
	}
	return resp, nil
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
		if ch := cs.pending[resp.GetId()]; ch != nil {
			delete(cs.pending, resp.GetId())
			ch <- resp
		}
		cs.mu.Unlock()
	}
}

// sessionLoop keeps the Driver's Session stream open until Close. While it
// is down, calls use the unary RPCs. A server without Session (an older
// dlockd) ends the loop: unary RPCs only.
func (d *Driver) sessionLoop() {
	defer d.watchWG.Done()
	ctx := d.watchCtx
	delay := 50 * time.Millisecond
	for ctx.Err() == nil {
		sctx, cancel := context.WithCancel(ctx)
		stream, err := d.client.Session(sctx, grpc.WaitForReady(true))
		if err == nil {
			cs := &callStream{stream: stream, pending: make(map[uint64]chan *dlockv1.SessionResponse)}
			d.calls.Store(cs)
			start := time.Now()
			err = cs.recvLoop()
			d.calls.CompareAndSwap(cs, nil)
			if time.Since(start) > time.Second {
				delay = 50 * time.Millisecond
			}
		}
		cancel()
		if status.Code(err) == codes.Unimplemented {
			return
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(delay*2, 2*time.Second)
	}
}
