// Package dlockddriver is the dlock driver for dlockd, the dlock lock server
// (package server, command cmd/dlockd). Import it for its side effect to
// open "dlockd://host:port" URLs with dlock.Open:
//
//	import _ "github.com/dlock-dev/dlock/drivers/dlockddriver"
//
// # URL
//
// dlockd://host:port?lock_delay=DURATION. Both the host and the port must
// be given (dlockd's usual port is DefaultPort, 7450): an empty host or port
// is a configuration error at Open, never a default, so that
// dlockd://$LOCKHOST:7450 with LOCKHOST unset cannot make every machine lock
// against a dlockd of its own. lock_delay (a Go duration such as 2s; see
// Options.LockDelay) is sent with every acquisition; absent or 0 means the
// server's default. Any other parameter, or a lock_delay that is negative
// or not a duration, is a configuration error at Open.
//
// # Capabilities
//
//   - driver.Driver: TryAcquire, Renew (one item of the server's batched
//     renewal), Release.
//   - driver.Waiter: Wait queues on the server's FIFO queue for the key and is
//     told of the grant by the server in the same Raft entry that released
//     the previous holder: no polling. A grant handed over this way must be
//     claimed within the server's claim window; Wait claims it (a renewal)
//     before it returns, and queues again if the window passed. When the
//     caller's context ends, Wait cancels on the same stream and returns only
//     after the server has removed the queue entry (or released a grant that
//     raced the cancellation), bounded by Options.CleanupTimeout.
//   - driver.Inspector: Inspect and List, linearizable reads on the leader;
//     List follows the server's pages until the last.
//   - driver.ForceReleaser: ForceRelease removes a grant whoever holds it,
//     with a reason the server logs (dlock release --force).
//   - Loss push: each Driver keeps one Watch stream (its session) open; when
//     the server ends a grant made by this Driver without a release
//     (expired, force-released, or handed over and not claimed), Grant.Lost
//     closes at once, and the reason is kept for the error of a later Renew
//     or Release of that grant. While the stream is down, loss is found by
//     renewals and the validity deadline instead.
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
// server). A grant lost without a release keeps its key from everyone for
// the lock-delay, so that a paused holder's in-flight writes land before
// the next holder starts (Chubby's lock-delay); fencing at the resource is
// still the real protection. Connection failures are returned as plain
// errors; the root package reports them as dlock.ErrUnavailable.
package dlockddriver

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	"github.com/dlock-dev/dlock/drivers/internal/notgrpc"
	"github.com/dlock-dev/dlock/internal/urlparam"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Scheme is the URL scheme of dlockd stores.
const Scheme = "dlockd"

// DefaultPort is dlockd's usual port (cmd/dlockd's default listen port).
// A dlockd URL must still name its port: Open does not default it.
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
	// LockDelay is sent with every acquisition: after the grant is lost
	// without a release (expiry, force release, a handover not claimed in
	// time), the server grants the key to nobody for this long. It is capped
	// at each grant's TTL (the server's limit). Zero: the server's default
	// (dlockd --lock-delay). Negative: Dial fails (New treats it as zero).
	LockDelay time.Duration
	// ListPageSize is how many holders List asks for per request. Zero: the
	// server's default page. Negative or above 2^32-1: Dial fails (New
	// treats it as zero).
	ListPageSize int
}

// check reports a configuration error in o (matching
// driver.ErrInvalidArgument), never an outage.
func (o *Options) check() error {
	if o.LockDelay < 0 {
		return urlparam.Invalid("dlockd: lock delay %v is negative", o.LockDelay)
	}
	if o.ListPageSize < 0 || int64(o.ListPageSize) > math.MaxUint32 {
		return urlparam.Invalid("dlockd: list page size %d is outside [0, %d]", o.ListPageSize, uint32(math.MaxUint32))
	}
	return nil
}

// Driver is a dlockd client. It is safe for concurrent use. Two Drivers are
// two independent clients.
type Driver struct {
	cc        *grpc.ClientConn // owned; nil when built on a caller's connection
	client    dlockv1.LockClient
	session   string
	cleanup   time.Duration
	lockDelay time.Duration
	pageSize  uint32
	noWatch   bool

	mu          sync.Mutex
	closed      bool
	lost        map[grantKey]lostEntry // Lost channels of live grants
	reasons     map[grantKey]string    // the server's reasons of recent losses
	reasonOrder []grantKey             // reasons' keys, oldest first

	watchCtx    context.Context
	watchCancel context.CancelFunc
	watchWG     sync.WaitGroup // the Watch and Session loops

	calls atomic.Pointer[callStream] // the Session stream; nil: use unary RPCs
}

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.Waiter        = (*Driver)(nil)
	_ driver.Inspector     = (*Driver)(nil)
	_ driver.ForceReleaser = (*Driver)(nil)
)

// urlParams are the query parameters Open understands.
var urlParams = []string{"lock_delay"}

// Open opens a Driver for a dlockd://host:port[?lock_delay=DURATION] URL
// (see the package documentation). The connection is made lazily: Open
// does not fail when the server is down. It returns an error matching
// driver.ErrInvalidArgument (never driver.ErrUnavailable) for another
// scheme, an empty host, a missing or empty port, a port outside 1..65535,
// more than one host, a user or path, an unknown query parameter,
// or a lock_delay that is not a duration or is negative.
func Open(ctx context.Context, u *url.URL) (*Driver, error) {
	if u.Scheme != Scheme {
		return nil, urlparam.Invalid("dlockd: URL scheme %q, want %q", u.Scheme, Scheme)
	}
	opts := &Options{}
	q := u.Query()
	if err := urlparam.Known("dlockd", q, urlParams...); err != nil {
		return nil, err
	}
	if v := q.Get("lock_delay"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return nil, urlparam.Invalid("dlockd: URL parameter lock_delay=%q is not a duration of 0 or more", v)
		}
		opts.LockDelay = d
	}
	if strings.Contains(u.Host, ",") {
		return nil, urlparam.Invalid("dlockd: URL host %q names more than one server; name one", u.Host)
	}
	if err := urlparam.Addrs("dlockd", u.Host, "dlockd://HOST:PORT", true); err != nil {
		return nil, err
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") {
		return nil, urlparam.Invalid("dlockd: URL %q: want dlockd://host:port[?lock_delay=DURATION], without user or path", u.Redacted())
	}
	return Dial(u.Host, opts)
}

// Dial opens a Driver on the dlockd at target (host:port) with its own gRPC
// connection, which Close closes. It returns an error for invalid opts or
// a target gRPC refuses, and an error matching driver.ErrInvalidArgument
// for a target without a host or a port; it does not connect yet.
func Dial(target string, opts *Options) (*Driver, error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := opts.check(); err != nil {
		return nil, err
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
	if err := urlparam.Addrs("dlockd", target, "HOST:PORT", true); err != nil {
		return nil, err
	}
	cc, err := grpc.NewClient("passthrough:///"+target, append(dopts, opts.DialOptions...)...)
	if err != nil {
		return nil, urlparam.Wrap("dlockd: dial "+target, err)
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
		client:    dlockv1.NewLockClient(cc),
		session:   newSession(),
		cleanup:   opts.CleanupTimeout,
		lockDelay: max(opts.LockDelay, 0),
		noWatch:   opts.NoWatch,
		lost:      make(map[grantKey]lostEntry),
		reasons:   make(map[grantKey]string),
	}
	if opts.ListPageSize > 0 && int64(opts.ListPageSize) <= math.MaxUint32 {
		d.pageSize = uint32(opts.ListPageSize)
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
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("dlockd: acquire: %w", err)
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

// acquireReq is req as the server wants it, with the Driver's session and
// lock-delay (capped at the TTL, the server's limit).
func (d *Driver) acquireReq(req driver.AcquireRequest, wait bool) *dlockv1.AcquireRequest {
	areq := &dlockv1.AcquireRequest{
		Key: req.Key, Owner: req.Owner, Ttl: durationpb.New(req.TTL), Holder: req.Holder,
		Wait: wait, Session: d.session,
	}
	if d.lockDelay > 0 {
		areq.LockDelay = durationpb.New(min(d.lockDelay, req.TTL))
	}
	return areq
}

// Renew implements driver.Driver.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("dlockd: renew: %w", err)
	}
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
// item (nil, or driver.ErrLeaseLost wrapped with the server's reason when
// known, or driver.ErrInvalidKey / driver.ErrInvalidTTL), or a request
// error (an invalid item may fail the whole request; connection failures
// are plain errors).
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
		it := items[i]
		switch {
		case r.GetOk():
		case r.GetReason() == "INVALID_KEY":
			errs[i] = fmt.Errorf("dlockd: renew %q: %w", it.Key, driver.ErrInvalidKey)
		case r.GetReason() == "INVALID_TTL":
			errs[i] = fmt.Errorf("dlockd: renew %q: %w: %v", it.Key, driver.ErrInvalidTTL, it.TTL)
		case strings.HasPrefix(r.GetReason(), "INVALID_"):
			// INVALID_OWNER, INVALID_REQUEST: refused as invalid, not lost.
			errs[i] = fmt.Errorf("dlockd: renew %q: %w: the server refused it (%s)", it.Key, driver.ErrInvalidArgument, r.GetReason())
		default:
			errs[i] = fmt.Errorf("dlockd: renew %q: %w", it.Key, d.leaseLost(it.Key, it.Owner))
			d.forget(it.Key, it.Owner)
		}
	}
	return errs, nil
}

// leaseLost is driver.ErrLeaseLost for owner's grant on key, with the
// server's reason when the Watch stream told one.
func (d *Driver) leaseLost(key, owner string) error {
	if why := d.lossReason(key, owner); why != "" {
		return fmt.Errorf("%w (%s)", driver.ErrLeaseLost, why)
	}
	return driver.ErrLeaseLost
}

// Release implements driver.Driver.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if d.isClosed() {
		return driver.ErrClosed
	}
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("dlockd: release: %w", err)
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
			return d.leaseLost(key, owner) // the root package adds the operation, key and store
		}
		return err
	}
	d.forget(key, owner)
	return nil
}

// mapErr turns a gRPC error into the driver's: the contract's sentinels for
// the server's answers, a plain error (ErrUnavailable at the root) for the
// rest, and ctx's error joined when ctx ended.
//
// The server's answers map as follows (its reason, after the code, where it
// matters):
//
//   - FailedPrecondition (LOCK_HELD): driver.ErrNotAcquired.
//   - NotFound (LEASE_LOST, NOT_HELD): driver.ErrLeaseLost.
//   - InvalidArgument: INVALID_KEY is driver.ErrInvalidKey, INVALID_TTL
//     driver.ErrInvalidTTL, an invalid holder driver.ErrInvalidHolder, any
//     other (INVALID_OWNER, INVALID_REQUEST) driver.ErrInvalidArgument.
//   - OutOfRange, AlreadyExists (DUPLICATE_WAIT: the owner token already
//     waits), ResourceExhausted with REQUEST_TOO_LARGE or a message over
//     gRPC's size limit, PermissionDenied and Unauthenticated: the request
//     itself was refused, so driver.ErrInvalidArgument; retrying cannot
//     help.
//   - A peer that answers but does not speak dlockd's protocol (the URL
//     points at Redis, an HTTP/1.1 server, a plain server when TLS was
//     asked, ...): driver.ErrInvalidArgument, "the server does not speak
//     the dlockd protocol (is it dlockd?)" — a configuration error, so
//     WithFailOpen must not run work unlocked. grpc-go has no status code
//     for this (it reports codes.Unavailable with its transport's text), so
//     the class is recognised by message (drivers/internal/notgrpc).
//   - Everything else is a plain error, reported by the root package as
//     ErrUnavailable: Unavailable (connection failures, NOT_LEADER,
//     SHUTTING_DOWN: transient, the root retries them), DeadlineExceeded,
//     ResourceExhausted for the server's capacity (TOO_MANY_WAITERS,
//     TOO_MANY_LEASES, TOO_MANY_STREAMS, ...), Internal, Unknown.
//
// The root package adds the operation, key and store URL, so the error says
// only what the server answered, in its own words, without gRPC's
// "rpc error: code = ... desc =" wrapping.
func mapErr(ctx context.Context, op, key string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	msg := st.Message()
	reason := ""
	if i := strings.LastIndex(msg, " ("); i >= 0 && strings.HasSuffix(msg, ")") {
		reason = msg[i+2 : len(msg)-1]
	}
	var sentinel error
	switch st.Code() {
	case codes.FailedPrecondition:
		sentinel = driver.ErrNotAcquired
	case codes.NotFound:
		sentinel = driver.ErrLeaseLost
	case codes.InvalidArgument:
		switch {
		case reason == "INVALID_KEY":
			sentinel = driver.ErrInvalidKey
		case reason == "INVALID_TTL":
			sentinel = driver.ErrInvalidTTL
		case strings.Contains(msg, "invalid holder"):
			sentinel = driver.ErrInvalidHolder
		default:
			sentinel = driver.ErrInvalidArgument
		}
	case codes.OutOfRange, codes.AlreadyExists, codes.PermissionDenied, codes.Unauthenticated:
		sentinel = driver.ErrInvalidArgument
	case codes.ResourceExhausted:
		// gRPC's own size refusal carries no reason code; a server
		// answer's text can quote the caller's key, so it is never
		// matched as text.
		if reason == "REQUEST_TOO_LARGE" || (!isReasonCode(reason) && strings.Contains(msg, "larger than max")) {
			sentinel = driver.ErrInvalidArgument
		}
	}
	// A peer that is not dlockd shows only in the transport's text; a
	// dlockd answer (it ends with a reason code and may quote the key) is
	// never read that way.
	if sentinel == nil && !isReasonCode(reason) && st.Code() != codes.OK && notgrpc.Is(msg) {
		return fmt.Errorf("%w: the server does not speak the dlockd protocol (is it dlockd?); check the URL's port (gRPC: %s)",
			driver.ErrInvalidArgument, notgrpc.Detail(msg))
	}
	switch {
	case sentinel == driver.ErrNotAcquired || sentinel == driver.ErrLeaseLost:
		return sentinel // the root package adds the operation, key and store
	case sentinel != nil: // keep the server's detail (which limit)
		return fmt.Errorf("%w: the server refused the %s: %s", sentinel, op, strings.TrimPrefix(msg, "dlockd: "))
	}
	if ctx.Err() != nil {
		return fmt.Errorf("dlockd %s: %w (%s: %s)", op, ctx.Err(), st.Code(), msg)
	}
	return fmt.Errorf("dlockd %s: %s: %s", op, st.Code(), msg)
}

// isReasonCode reports whether s looks like one of dlockd's reason codes
// (LOCK_HELD, NOT_LEADER, …): upper-case letters and underscores.
func isReasonCode(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if (r < 'A' || r > 'Z') && r != '_' {
			return false
		}
	}
	return true
}
