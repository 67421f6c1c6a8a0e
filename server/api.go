package server

import (
	"context"
	"errors"
	"io"
	"math"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// api implements dlockv1.LockServer over the Server; the JSON handlers call
// the same methods.
type api struct {
	dlockv1.UnimplementedLockServer
	s *Server
}

// maxHeaderBytes bounds the header list of a gRPC call and the headers of
// an HTTP request.
const maxHeaderBytes = 64 << 10

// connIdleTimeout is how long a gRPC connection may stay with no stream
// before the server closes it.
const connIdleTimeout = 2 * time.Minute

// newGRPCServer returns the gRPC server of s, with its limits and panic
// recovery.
func newGRPCServer(s *Server) *grpc.Server {
	lim := s.limits()
	codec := newRequestCodec() // a request that does not decode is INVALID_ARGUMENT, not INTERNAL (decode.go)
	g := grpc.NewServer(
		grpc.ForceServerCodecV2(codec),
		grpc.MaxRecvMsgSize(s.cfg.MaxRequestBytes),
		grpc.Creds(apiCreds{}), // the mux did the TLS handshake; this passes its state on (tls.go)
		// Static flow-control windows: no BDP ping probing on every
		// connection, which costs a round of frames per burst of small
		// messages. A stream's window is HTTP/2's default, 64 KiB (about
		// a thousand Session calls): it bounds what a client can push on
		// a stream the server does not read (a Session stream at its
		// call or byte budget), to 64 MiB for a connection with 1,024
		// streams where 1 MiB windows allowed 1 GiB.
		grpc.InitialWindowSize(65535),
		grpc.InitialConnWindowSize(1<<20),
		// A pool of stream workers with grown stacks serves requests
		// instead of a new goroutine each (measured about 2x the
		// uncontended throughput on 2 cores). Long waits do not starve
		// it: grpc-go starts a goroutine when every worker is busy.
		grpc.NumStreamWorkers(uint32(8*runtime.GOMAXPROCS(0))),
		// Ping idle connections so that a client that vanished without
		// closing its connection is found within 40s: its waits are then
		// cancelled and their queue entries removed.
		// A connection with no stream for connIdleTimeout is closed (a
		// GOAWAY), so idle connections cannot hold every slot of
		// MaxConnections for good; clients redial when they need one.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, MaxConnectionIdle: connIdleTimeout}),
		// Request headers are bounded like bodies: gRPC's own default
		// (16 MiB per header list) let 60 streams hold a gigabyte.
		grpc.MaxHeaderListSize(maxHeaderBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Streams at once per connection (HTTP/2
		// SETTINGS_MAX_CONCURRENT_STREAMS): a client queues the rest.
		grpc.MaxConcurrentStreams(uint32(s.cfg.MaxStreamsPerConnection)),
		// Outermost first: the metrics count what recovery and the limits
		// answer; recovery covers the limits and the handler.
		// Forwarding to the leader comes last, so that a forwarded call
		// is counted, recovered and limited as a local one.
		// Authentication (auth.go) comes before forwarding: a follower
		// checks a call before it forwards it.
		// A client certificate (--tls-client-ca, tls.go) is checked just
		// before authentication.
		// A request that did not decode is refused right after recovery
		// (checkDecodedUnary); a stream's messages are checked innermost,
		// as the handler receives them.
		grpc.ChainUnaryInterceptor(s.metrics.unaryInterceptor, s.recoverUnary, codec.checkDecodedUnary, lim.unaryInterceptor, s.requireClientCertUnary, s.authUnary, newGRPCForwarder(s).unaryInterceptor),
		grpc.ChainStreamInterceptor(s.metrics.streamInterceptor, s.recoverStream, lim.streamInterceptor, s.requireClientCertStream, s.authStream, codec.checkDecodedStream),
	)
	dlockv1.RegisterLockServer(g, &api{s: s})
	return g
}

// dur converts a protobuf TTL; nil is 0 (the default TTL). A malformed
// one (out of protobuf's range of ±10,000 years, or seconds and nanos of
// different signs), zero or negative is INVALID_TTL, with a message that
// says which.
func dur(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, apiErr(codes.InvalidArgument, ReasonInvalidTTL, "invalid TTL (seconds %d, nanos %d): %v", d.GetSeconds(), d.GetNanos(), err)
	}
	if secs := d.GetSeconds(); secs > math.MaxInt64/int64(time.Second) {
		// AsDuration would saturate, and the TTL check would then name a
		// value nobody sent.
		return 0, apiErr(codes.InvalidArgument, ReasonInvalidTTL, "invalid TTL of %d s: longer than any TTL", secs)
	}
	if t := d.AsDuration(); t <= 0 {
		return 0, apiErr(codes.InvalidArgument, ReasonInvalidTTL, "invalid TTL %v: zero or negative (leave it out for the server's default)", t)
	}
	return d.AsDuration(), nil
}

func (a *api) acquireIn(req *dlockv1.AcquireRequest) (acquireIn, error) {
	ttl, err := dur(req.GetTtl())
	if err != nil {
		return acquireIn{}, err
	}
	in := acquireIn{key: req.GetKey(), owner: req.GetOwner(), holder: req.GetHolder(), session: req.GetSession(), ttl: ttl, wait: req.GetWait(), shared: req.GetShared(), limit: req.GetLimit()}
	if d := req.GetLockDelay(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return acquireIn{}, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid lock_delay %v: want a duration from 0 to the TTL", d.AsDuration())
		}
		in.lockDelay, in.hasLockDelay = d.AsDuration(), true
	}
	return in, nil
}

func grantPB(g acquireOut) *dlockv1.AcquireResponse {
	r := &dlockv1.AcquireResponse{Key: g.key, Owner: g.owner, Fence: g.fence, Ttl: durationpb.New(g.ttl)}
	if g.claimWithin > 0 {
		r.ClaimWithin = durationpb.New(g.claimWithin)
	}
	return r
}

// Acquire implements dlockv1.LockServer.
func (a *api) Acquire(ctx context.Context, req *dlockv1.AcquireRequest) (*dlockv1.AcquireResponse, error) {
	if err := a.s.authorizeRequest(ctx, req); err != nil { // lock (auth.go)
		return nil, err
	}
	in, err := a.acquireIn(req)
	if err != nil {
		return nil, err
	}
	g, err := a.s.acquire(ctx, in, nil, nil)
	if err != nil {
		return nil, err
	}
	return grantPB(g), nil
}

// Wait implements dlockv1.LockServer: see the proto.
//
// A node that is not the leader ends the stream at once with NOT_LEADER and
// the leader hint (streams are not forwarded): the client opens it again at
// the leader.
func (a *api) Wait(stream dlockv1.Lock_WaitServer) error {
	if err := a.s.writable(); err != nil {
		return err
	}
	req, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		// Half-closed with no request: a malformed call, not an unknown
		// error (grpc-go reports a handler's bare io.EOF as UNKNOWN).
		return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "wait: the stream was closed before its request")
	}
	if err != nil {
		return err
	}
	if err := a.s.authorizeRequest(stream.Context(), req); err != nil { // lock (auth.go)
		return err
	}
	in, err := a.acquireIn(req)
	if err != nil {
		return err
	}
	in.wait = true
	cancel := make(chan struct{})
	go func() { // any further message, a half-close or the stream's end cancels
		_, _ = stream.Recv()
		close(cancel)
	}()
	// For a held key, acquire sends QUEUED from a pooled worker and parks
	// this goroutine with a small stack (core.go).
	g, err := a.s.acquire(stream.Context(), in, cancel, func(pos int) {
		_ = stream.Send(&dlockv1.WaitEvent{Type: dlockv1.WaitEvent_QUEUED, Position: uint32(min(pos, 1<<31))})
	})
	if errors.Is(err, errWaitCancelled) {
		return stream.Send(&dlockv1.WaitEvent{Type: dlockv1.WaitEvent_CANCELLED})
	}
	if err != nil {
		return err
	}
	if err := stream.Send(&dlockv1.WaitEvent{Type: dlockv1.WaitEvent_GRANTED, Grant: grantPB(g)}); err != nil {
		// The grant did not reach its receiver: release it at once rather
		// than let the key sit with nobody for the claim window.
		_ = a.s.undo(keyOwner{g.key, g.owner})
		return err
	}
	return nil
}

// Renew implements dlockv1.LockServer.
func (a *api) Renew(ctx context.Context, req *dlockv1.RenewRequest) (*dlockv1.RenewResponse, error) {
	if err := a.s.authorizeRequest(ctx, req); err != nil { // lock on every key (auth.go)
		return nil, err
	}
	items := make([]renewIn, len(req.GetItems()))
	for i, it := range req.GetItems() {
		ttl, err := dur(it.GetTtl())
		if err != nil {
			return nil, err
		}
		items[i] = renewIn{key: it.GetKey(), owner: it.GetOwner(), ttl: ttl}
	}
	ok, err := a.s.renew(items)
	if err != nil {
		return nil, err
	}
	resp := &dlockv1.RenewResponse{Results: make([]*dlockv1.RenewResult, len(items))}
	for i, it := range items {
		r := &dlockv1.RenewResult{Key: it.key, Owner: it.owner, Ok: ok[i]}
		if !ok[i] {
			r.Reason = ReasonLeaseLost
		}
		resp.Results[i] = r
	}
	return resp, nil
}

// Release implements dlockv1.LockServer.
func (a *api) Release(ctx context.Context, req *dlockv1.ReleaseRequest) (*dlockv1.ReleaseResponse, error) {
	if err := a.s.authorizeRequest(ctx, req); err != nil { // lock (auth.go)
		return nil, err
	}
	next, err := a.s.release(req.GetKey(), req.GetOwner())
	if err != nil {
		return nil, err
	}
	return &dlockv1.ReleaseResponse{NextFence: next}, nil
}

// CancelWait implements dlockv1.LockServer.
func (a *api) CancelWait(ctx context.Context, req *dlockv1.CancelWaitRequest) (*dlockv1.CancelWaitResponse, error) {
	if err := a.s.authorizeRequest(ctx, req); err != nil { // lock (auth.go)
		return nil, err
	}
	r, err := a.s.cancelWait(req.GetKey(), req.GetOwner())
	if err != nil {
		return nil, err
	}
	return &dlockv1.CancelWaitResponse{Dequeued: r.dequeued, Released: r.released}, nil
}

// CheckFence implements dlockv1.LockServer.
func (a *api) CheckFence(ctx context.Context, req *dlockv1.CheckFenceRequest) (*dlockv1.CheckFenceResponse, error) {
	if err := a.s.authorizeRequest(ctx, req); err != nil { // read (auth.go)
		return nil, err
	}
	cur, fence, err := a.s.checkFence(req.GetKey(), req.GetFence())
	if err != nil {
		return nil, err
	}
	return &dlockv1.CheckFenceResponse{Current: cur, CurrentFence: fence}, nil
}

func holderPB(h holderOut) *dlockv1.HolderInfo {
	p := &dlockv1.HolderInfo{Key: h.key, Fence: h.fence, Holder: h.holder, Ttl: durationpb.New(h.ttl), Waiters: uint32(min(h.waiters, 1<<31))}
	if h.hasRemaining {
		p.Remaining = durationpb.New(h.remaining)
	}
	if h.shared {
		p.Shared, p.Limit, p.Holders, p.LostGrants = true, uint32(h.limit), uint32(min(h.holders, 1<<31)), uint32(min(h.delayed, 1<<31))
	}
	return p
}

// Inspect implements dlockv1.LockServer.
func (a *api) Inspect(ctx context.Context, req *dlockv1.InspectRequest) (*dlockv1.InspectResponse, error) {
	if err := a.s.authorizeRequest(ctx, req); err != nil { // read (auth.go)
		return nil, err
	}
	h, held, err := a.s.inspect(req.GetKey())
	if err != nil {
		return nil, err
	}
	if !held {
		r := &dlockv1.InspectResponse{Waiters: uint32(min(h.waiters, 1<<31))}
		if h.inDelay {
			r.LockDelayRemaining = durationpb.New(h.delayLeft)
		}
		return r, nil
	}
	r := &dlockv1.InspectResponse{Held: true, Info: holderPB(h), Waiters: uint32(min(h.waiters, 1<<31))}
	for i := 0; i < len(h.grants) && i < maxInspectGrants; i++ {
		r.Grants = append(r.Grants, holderPB(h.grants[i]))
	}
	return r, nil
}

// List implements dlockv1.LockServer.
//
// With an auth file, a list is allowed when the caller may read some key
// under the prefix, and scans only the keys it may read (Server.list):
// its holders and its next_page_token name readable keys alone.
func (a *api) List(ctx context.Context, req *dlockv1.ListRequest) (*dlockv1.ListResponse, error) {
	if err := a.s.authorizeRequest(ctx, req); err != nil { // read under the prefix (auth.go)
		return nil, err
	}
	hs, next, err := a.s.list(ctx, req.GetPrefix(), req.GetPageToken(), int(req.GetLimit()))
	if err != nil {
		return nil, err
	}
	resp := &dlockv1.ListResponse{Holders: make([]*dlockv1.HolderInfo, len(hs)), NextPageToken: next}
	for i, h := range hs {
		resp.Holders[i] = holderPB(h)
	}
	return resp, nil
}

// ForceRelease implements dlockv1.LockServer.
// Every force release is audited (audit.go).
func (a *api) ForceRelease(ctx context.Context, req *dlockv1.ForceReleaseRequest) (*dlockv1.ForceReleaseResponse, error) {
	if err := a.s.authorizeRequest(ctx, req); err != nil { // admin (auth.go)
		return nil, err
	}
	h, next, err := a.s.forceRelease(req.GetKey(), req.GetReason())
	a.s.audit(ctx, "force-release", req.GetKey(), req.GetReason(), err)
	if err != nil {
		return nil, err
	}
	return &dlockv1.ForceReleaseResponse{Removed: holderPB(h), NextFence: next, RemovedGrants: uint32(max(h.removedGrants, 1))}, nil
}

// maxWatchKeys is the most keys one Watch stream may watch.
const maxWatchKeys = 100

// Watch implements dlockv1.LockServer. With an auth file, any
// authenticated caller may watch; it is sent the events of the keys it may
// lock or read only (auth.go). Each watched key (WatchRequest.keys) gets a
// CHANGED event whenever an applied batch changed its grants.
func (a *api) Watch(req *dlockv1.WatchRequest, stream dlockv1.Lock_WatchServer) error {
	if err := checkToken("session", req.GetSession()); err != nil {
		return err
	}
	if len(req.GetKeys()) > maxWatchKeys {
		return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "watch: %d keys > %d", len(req.GetKeys()), maxWatchKeys)
	}
	for _, k := range req.GetKeys() {
		if err := a.s.checkKey(k); err != nil {
			return err
		}
	}
	sub := a.s.sessions.subscribe(req.GetSession(), a.s.cfg.MaxWatchBacklog, req.GetKeys()...)
	defer a.s.sessions.unsubscribe(req.GetSession(), sub)
	if err := stream.Send(&dlockv1.WatchEvent{Type: dlockv1.WatchEvent_READY}); err != nil {
		return err
	}
	for {
		select {
		case <-sub.wake:
			evs, overflow := a.s.sessions.take(sub)
			for i := range evs {
				ev := &evs[i]
				if !a.s.allowed(stream.Context(), PermLock, ev.key) && !a.s.allowed(stream.Context(), PermRead, ev.key) {
					continue
				}
				if ev.kind == evKeyChanged {
					if err := stream.Send(&dlockv1.WatchEvent{Type: dlockv1.WatchEvent_CHANGED, Key: ev.key}); err != nil {
						return err
					}
					continue
				}
				if err := stream.Send(&dlockv1.WatchEvent{Type: dlockv1.WatchEvent_LOST, Key: ev.key, Owner: ev.owner, Fence: ev.fence, Reason: ev.reason.String()}); err != nil {
					return err
				}
			}
			if overflow {
				// The client reads slower than its leases end: end the
				// stream rather than drop a loss in silence; the client
				// reconnects.
				err := apiErr(codes.ResourceExhausted, ReasonWatchBacklogFull, "watch: more than %d loss events unread; reconnect, and count the session's leases as possibly lost until renewed", a.s.cfg.MaxWatchBacklog)
				a.s.limits().refused(limitWatchBacklog, err.Error())
				return err
			}
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-a.s.closing:
			return status.Error(codes.Unavailable, "dlockd: shutting down (SHUTTING_DOWN)")
		}
	}
}
