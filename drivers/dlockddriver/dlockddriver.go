// Package dlockddriver is the dlock driver for dlockd, the dlock lock server
// (package server, command cmd/dlockd). Import it for its side effect to
// open "dlockd://host:port" URLs with dlock.Open:
//
//	import _ "github.com/dlock-dev/dlock/drivers/dlockddriver"
//
// # Capabilities
//
//   - driver.Driver: TryAcquire, Renew (one item of the server's batched
//     renewal), Release.
//   - driver.Waiter: Wait queues on the server's FIFO queue for the key and is
//     told of the grant by the server in the same Raft entry that released
//     the previous holder: no polling. When the caller's context ends, Wait
//     cancels on the same stream and returns only after the server has
//     removed the queue entry (or released a grant that raced the
//     cancellation), bounded by Options.CleanupTimeout.
//   - driver.Inspector: Inspect and List, linearizable reads on the leader.
//   - Loss push: each Driver keeps one Watch stream (its session) open; when
//     the server expires a grant made by this Driver, Grant.Lost closes.
//     While the stream is down, loss is found by renewals and the validity
//     deadline instead.
//
// TryAcquire, Release and Renew travel on one Session stream per Driver,
// shared by all its calls (one message each way per call); while the stream
// is not open (at start, after a failure, or with an older server) they use
// the unary RPCs. Options.NoSession forces unary RPCs.
//
// Beyond the driver interfaces, Driver has RenewBatch (many grants in one
// request) and CheckFence (Chubby's sequencer check: is fence F the current
// grant of key K — a weaker check than a resource that stores fences).
//
// # Guarantees
//
// Fences are Raft log indexes: greater than every fence issued before on the
// server, surviving restarts (the log is fsynced). Expiry is decided by the
// server leader's monotonic clock, late rather than early (see package
// server). Connection failures are returned as plain errors; the root package
// reports them as dlock.ErrUnavailable.
package dlockddriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dlock-dev/dlock/driver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Scheme is the URL scheme of dlockd stores.
const Scheme = "dlockd"

// DefaultPort is the port of a dlockd URL that names none.
const DefaultPort = "7450"

func init() {
	driver.Register(Scheme, func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return Open(ctx, u)
	})
}

// Options configure a Driver. A nil *Options means all defaults.
type Options struct {
	// DialOptions are added to the gRPC dial options (after the defaults:
	// insecure credentials and a reconnect backoff capped at 1s).
	DialOptions []grpc.DialOption
	// CleanupTimeout bounds the cleanup Wait does after its context ended
	// (cancelling the queue entry, releasing a raced grant). Zero: 5s.
	CleanupTimeout time.Duration
	// NoWatch turns the loss-push stream off: Grant.Lost stays nil.
	NoWatch bool
	// NoSession makes every call a unary RPC instead of a message on the
	// Driver's Session stream (which costs less per call).
	NoSession bool
}

// Driver is a dlockd client. It is safe for concurrent use. Two Drivers are
// two independent clients.
type Driver struct {
	cc      *grpc.ClientConn // owned; nil when built on a caller's connection
	client  dlockv1.LockClient
	session string
	cleanup time.Duration

	mu     sync.Mutex
	closed bool
	lost   map[grantKey]chan struct{}

	watchCtx    context.Context
	watchCancel context.CancelFunc
	watchWG     sync.WaitGroup // the Watch and Session loops

	calls atomic.Pointer[callStream] // the Session stream; nil: use unary RPCs
}

type grantKey struct{ key, owner string }

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Waiter    = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
)

// Open opens a Driver for a dlockd://host:port URL (port 7450 when missing,
// host 127.0.0.1 when empty). The connection is made lazily: Open does not
// fail when the server is down.
func Open(ctx context.Context, u *url.URL) (*Driver, error) {
	if u.Scheme != Scheme {
		return nil, fmt.Errorf("dlockd: URL scheme %q, want %q", u.Scheme, Scheme)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = DefaultPort
	}
	return Dial(net.JoinHostPort(host, port), nil)
}

// Dial opens a Driver on the dlockd at target (host:port) with its own gRPC
// connection, which Close closes.
func Dial(target string, opts *Options) (*Driver, error) {
	if opts == nil {
		opts = &Options{}
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
		// Find a dead server within about 40s even with no call running.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		// Static flow-control windows turn off BDP ping probing.
		grpc.WithInitialWindowSize(1 << 20),
		grpc.WithInitialConnWindowSize(1 << 20),
	}
	cc, err := grpc.NewClient("passthrough:///"+target, append(dopts, opts.DialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("dlockd: dial %s: %w", target, err)
	}
	d := newDriver(cc, opts)
	d.cc = cc
	return d, nil
}

// New returns a Driver over a connection the caller owns and closes; Close
// does not close it.
func New(cc grpc.ClientConnInterface, opts *Options) *Driver {
	if opts == nil {
		opts = &Options{}
	}
	return newDriver(cc, opts)
}

func newDriver(cc grpc.ClientConnInterface, opts *Options) *Driver {
	d := &Driver{
		client:  dlockv1.NewLockClient(cc),
		session: newSession(),
		cleanup: opts.CleanupTimeout,
		lost:    make(map[grantKey]chan struct{}),
	}
	if d.cleanup <= 0 {
		d.cleanup = 5 * time.Second
	}
	d.watchCtx, d.watchCancel = context.WithCancel(context.Background())
	if !opts.NoWatch {
		d.watchWG.Add(1)
		go d.watchLoop()
	}
	if !opts.NoSession {
		d.watchWG.Add(1)
		go d.sessionLoop()
	}
	return d
}

// Session returns the client session ID this Driver's grants are made
// under.
func (d *Driver) Session() string { return d.session }

// Close stops the Watch stream and closes the connection if Dial made it.
// Grants are not released: the server expires them. Closing twice returns
// nil.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.watchCancel()
	d.watchWG.Wait()
	if d.cc != nil {
		return d.cc.Close()
	}
	return nil
}

func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// TryAcquire implements driver.Driver.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	areq := d.acquireReq(req, false)
	sresp, err := d.invoke(ctx, &dlockv1.SessionRequest{Call: &dlockv1.SessionRequest_Acquire{Acquire: areq}})
	if err == nil {
		return d.grant(req, sresp.GetAcquire().GetFence()), nil
	}
	if err != errNoStream {
		return driver.Grant{}, mapErr(ctx, "acquire", req.Key, err)
	}
	resp, err := d.client.Acquire(ctx, areq)
	if err != nil {
		return driver.Grant{}, mapErr(ctx, "acquire", req.Key, err)
	}
	return d.grant(req, resp.GetFence()), nil
}

func (d *Driver) acquireReq(req driver.AcquireRequest, wait bool) *dlockv1.AcquireRequest {
	return &dlockv1.AcquireRequest{
		Key: req.Key, Owner: req.Owner, Ttl: durationpb.New(req.TTL), Holder: req.Holder,
		Wait: wait, Session: d.session,
	}
}

// grant registers the Lost channel of a new grant.
func (d *Driver) grant(req driver.AcquireRequest, fence uint64) driver.Grant {
	g := driver.Grant{Fence: fence}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.watchCtx.Err() == nil && !d.closed {
		ch := make(chan struct{})
		d.lost[grantKey{req.Key, req.Owner}] = ch
		g.Lost = ch
	}
	return g
}

// forget drops the Lost channel of a grant that ended without loss news.
func (d *Driver) forget(key, owner string) {
	d.mu.Lock()
	delete(d.lost, grantKey{key, owner})
	d.mu.Unlock()
}

// markLost closes the Lost channel of a grant the server expired.
func (d *Driver) markLost(key, owner string) {
	d.mu.Lock()
	k := grantKey{key, owner}
	if ch, ok := d.lost[k]; ok {
		close(ch)
		delete(d.lost, k)
	}
	d.mu.Unlock()
}

// Wait implements driver.Waiter over the server's Wait stream.
func (d *Driver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return driver.Grant{}, err
	}
	// The stream outlives ctx so that a cancellation can be confirmed by the
	// server; until the request is sent, ctx still cuts the stream.
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	defer scancel()
	var sentMu sync.Mutex
	sent := false
	stopEarly := context.AfterFunc(ctx, func() {
		sentMu.Lock()
		defer sentMu.Unlock()
		if !sent {
			scancel()
		}
	})
	defer stopEarly()

	stream, err := d.client.Wait(sctx)
	if err == nil {
		sentMu.Lock()
		if sctx.Err() == nil {
			err = stream.Send(d.acquireReq(req, true))
			sent = err == nil
		} else {
			err = sctx.Err()
		}
		sentMu.Unlock()
	}
	if err != nil { // the stream broke; the server cleans up what it got when the stream ends
		return driver.Grant{}, mapErr(ctx, "wait", req.Key, err)
	}

	events := make(chan recvd, 4)
	go func() {
		for {
			ev, err := stream.Recv()
			select {
			case events <- recvd{ev, err}:
			case <-sctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	for {
		select {
		case r := <-events:
			if r.err != nil {
				return driver.Grant{}, mapErr(ctx, "wait", req.Key, r.err)
			}
			switch r.ev.GetType() {
			case dlockv1.WaitEvent_GRANTED:
				return d.grant(req, r.ev.GetGrant().GetFence()), nil
			case dlockv1.WaitEvent_CANCELLED: // not asked for: treat as an outage
				return driver.Grant{}, fmt.Errorf("dlockd: wait %q: cancelled by the server", req.Key)
			}
		case <-ctx.Done():
			return driver.Grant{}, d.cancelWait(ctx, req, stream, events)
		}
	}
}

// recvd is one result of a Wait stream's Recv.
type recvd struct {
	ev  *dlockv1.WaitEvent
	err error
}

// cancelWait asks the server, on the wait's own stream, to remove the queue
// entry, and waits for its answer. A grant that arrives first is released.
func (d *Driver) cancelWait(ctx context.Context, req driver.AcquireRequest, stream dlockv1.Lock_WaitClient, events <-chan recvd) error {
	why := ctx.Err()
	_ = stream.CloseSend()
	timer := time.NewTimer(d.cleanup)
	defer timer.Stop()
	for {
		select {
		case r := <-events:
			if r.err != nil {
				if errors.Is(r.err, io.EOF) {
					return why
				}
				return errors.Join(why, fmt.Errorf("dlockd: wait %q: cancel not confirmed: %w", req.Key, r.err))
			}
			switch r.ev.GetType() {
			case dlockv1.WaitEvent_CANCELLED:
				return why
			case dlockv1.WaitEvent_GRANTED:
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cleanup)
				err := d.Release(rctx, req.Key, req.Owner)
				cancel()
				if err != nil && !errors.Is(err, driver.ErrLeaseLost) {
					return errors.Join(why, fmt.Errorf("dlockd: wait %q: release of a grant that raced the cancellation: %w", req.Key, err))
				}
				return why
			}
		case <-timer.C:
			return errors.Join(why, fmt.Errorf("dlockd: wait %q: cancel not confirmed within %v", req.Key, d.cleanup))
		}
	}
}

// Renew implements driver.Driver.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	errs, err := d.RenewBatch(ctx, []RenewItem{{Key: key, Owner: owner, TTL: ttl}})
	if err != nil {
		return err
	}
	return errs[0]
}

// RenewItem is one grant to renew.
type RenewItem struct {
	Key, Owner string
	// TTL is the new full TTL; zero keeps the grant's.
	TTL time.Duration
}

// RenewBatch renews many grants in one request. It returns one error per
// item (nil, or driver.ErrLeaseLost wrapped), or a request error (an
// invalid item fails the whole request; connection failures are plain
// errors).
func (d *Driver) RenewBatch(ctx context.Context, items []RenewItem) ([]error, error) {
	if d.isClosed() {
		return nil, driver.ErrClosed
	}
	req := &dlockv1.RenewRequest{Items: make([]*dlockv1.RenewItem, len(items))}
	for i, it := range items {
		req.Items[i] = &dlockv1.RenewItem{Key: it.Key, Owner: it.Owner}
		if it.TTL != 0 {
			req.Items[i].Ttl = durationpb.New(it.TTL)
		}
	}
	var resp *dlockv1.RenewResponse
	sresp, err := d.invoke(ctx, &dlockv1.SessionRequest{Call: &dlockv1.SessionRequest_Renew{Renew: req}})
	if err == nil {
		resp = sresp.GetRenew()
	} else if err == errNoStream {
		resp, err = d.client.Renew(ctx, req)
	}
	if err != nil {
		key := ""
		if len(items) == 1 {
			key = items[0].Key
		}
		return nil, mapErr(ctx, "renew", key, err)
	}
	if len(resp.GetResults()) != len(items) {
		return nil, fmt.Errorf("dlockd: renew: %d results for %d items", len(resp.GetResults()), len(items))
	}
	errs := make([]error, len(items))
	for i, r := range resp.GetResults() {
		if !r.GetOk() {
			errs[i] = fmt.Errorf("dlockd: renew %q: %w", items[i].Key, driver.ErrLeaseLost)
			d.forget(items[i].Key, items[i].Owner)
		}
	}
	return errs, nil
}

// Release implements driver.Driver.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if d.isClosed() {
		return driver.ErrClosed
	}
	rreq := &dlockv1.ReleaseRequest{Key: key, Owner: owner}
	_, err := d.invoke(ctx, &dlockv1.SessionRequest{Call: &dlockv1.SessionRequest_Release{Release: rreq}})
	if err == errNoStream {
		_, err = d.client.Release(ctx, rreq)
	}
	if err != nil {
		err = mapErr(ctx, "release", key, err)
		if errors.Is(err, driver.ErrLeaseLost) {
			d.forget(key, owner)
		}
		return err
	}
	d.forget(key, owner)
	return nil
}

// CheckFence reports whether fence is the current grant of key on the
// server (Chubby's sequencer check). It is weaker than a resource that
// stores the greatest fence it has seen: the answer can be stale by the time
// the caller acts on it.
func (d *Driver) CheckFence(ctx context.Context, key string, fence uint64) (bool, error) {
	if d.isClosed() {
		return false, driver.ErrClosed
	}
	resp, err := d.client.CheckFence(ctx, &dlockv1.CheckFenceRequest{Key: key, Fence: fence})
	if err != nil {
		return false, mapErr(ctx, "check fence", key, err)
	}
	return resp.GetCurrent(), nil
}

// Inspect implements driver.Inspector.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if d.isClosed() {
		return driver.HolderInfo{}, driver.ErrClosed
	}
	resp, err := d.client.Inspect(ctx, &dlockv1.InspectRequest{Key: key})
	if err != nil {
		return driver.HolderInfo{}, mapErr(ctx, "inspect", key, err)
	}
	if !resp.GetHeld() {
		return driver.HolderInfo{Key: key, Waiters: int(resp.GetWaiters())}, fmt.Errorf("dlockd: inspect %q: %w", key, driver.ErrNotAcquired)
	}
	return holderInfo(resp.GetInfo()), nil
}

// List implements driver.Inspector. It returns at most 10,000 holders (the
// server's default limit).
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	if d.isClosed() {
		return nil, driver.ErrClosed
	}
	resp, err := d.client.List(ctx, &dlockv1.ListRequest{Prefix: prefix, Limit: 10000})
	if err != nil {
		return nil, mapErr(ctx, "list", prefix, err)
	}
	out := make([]driver.HolderInfo, len(resp.GetHolders()))
	for i, h := range resp.GetHolders() {
		out[i] = holderInfo(h)
	}
	return out, nil
}

func holderInfo(h *dlockv1.HolderInfo) driver.HolderInfo {
	return driver.HolderInfo{
		Key: h.GetKey(), Fence: h.GetFence(), Holder: h.GetHolder(),
		TTL: h.GetTtl().AsDuration(), Remaining: h.GetRemaining().AsDuration(),
		Waiters: int(min(h.GetWaiters(), math.MaxInt32)),
	}
}

// watchLoop keeps the session's Watch stream open until Close, and closes
// the Lost channel of each grant the server reports expired.
func (d *Driver) watchLoop() {
	defer d.watchWG.Done()
	ctx := d.watchCtx
	delay := 50 * time.Millisecond
	for ctx.Err() == nil {
		stream, err := d.client.Watch(ctx, &dlockv1.WatchRequest{Session: d.session}, grpc.WaitForReady(true))
		if err == nil {
			for {
				ev, rerr := stream.Recv()
				if rerr != nil {
					break
				}
				delay = 50 * time.Millisecond
				if ev.GetType() == dlockv1.WatchEvent_LOST {
					d.markLost(ev.GetKey(), ev.GetOwner())
				}
			}
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

// mapErr turns a gRPC error into the driver's: the contract's sentinels for
// the server's answers, a plain error (ErrUnavailable at the root) for the
// rest, and ctx's error joined when ctx ended.
func mapErr(ctx context.Context, op, key string, err error) error {
	st, _ := status.FromError(err)
	msg := st.Message()
	var sentinel error
	switch st.Code() {
	case codes.FailedPrecondition:
		sentinel = driver.ErrNotAcquired
	case codes.NotFound:
		sentinel = driver.ErrLeaseLost
	case codes.InvalidArgument:
		switch {
		case strings.HasSuffix(msg, "(INVALID_KEY)"):
			sentinel = driver.ErrInvalidKey
		case strings.HasSuffix(msg, "(INVALID_TTL)"):
			sentinel = driver.ErrInvalidTTL
		}
	}
	switch {
	case sentinel == driver.ErrNotAcquired || sentinel == driver.ErrLeaseLost:
		return sentinel // the root package adds the operation, key and store
	case sentinel != nil: // keep the server's detail (which limit)
		return fmt.Errorf("dlockd: %s %q: %w (server: %s)", op, key, sentinel, msg)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("dlockd: %s %q: %w (%w)", op, key, ctx.Err(), err)
	}
	return fmt.Errorf("dlockd: %s %q: %w", op, key, err)
}
