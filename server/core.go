package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons carried by API errors, next to the gRPC code, so that clients can
// tell answers apart without parsing messages.
const (
	ReasonInvalidKey     = "INVALID_KEY"
	ReasonInvalidTTL     = "INVALID_TTL"
	ReasonInvalidOwner   = "INVALID_OWNER"
	ReasonInvalidRequest = "INVALID_REQUEST"
	ReasonLockHeld       = "LOCK_HELD"
	ReasonLeaseLost      = "LEASE_LOST"
	ReasonTooManyWaiters = "TOO_MANY_WAITERS"
	ReasonTooManyLeases  = "TOO_MANY_LEASES"
	ReasonTooLarge       = "REQUEST_TOO_LARGE"
	ReasonDuplicateWait  = "DUPLICATE_WAIT"
	ReasonNotLeader      = "NOT_LEADER"
	ReasonShuttingDown   = "SHUTTING_DOWN"
	ReasonCancelled      = "CANCELLED"
	ReasonInternal       = "INTERNAL"
	// ReasonDiverged: this member skipped a committed log entry it could
	// not decode (ErrUndecodableEntry) and no longer serves.
	ReasonDiverged = "DIVERGED"
)

// apiError is an answer of the API: a gRPC code, a reason and a message.
type apiError struct {
	code   codes.Code
	reason string
	msg    string
	// leader, on a NOT_LEADER answer, names the leader as this node knows
	// it: sent as an errdetails.ErrorInfo detail over gRPC, and as the
	// "leader" field and Dlock-Leader header over HTTP (see forward.go).
	leader *leaderHint
}

func (e *apiError) Error() string { return "dlockd: " + e.msg + " (" + e.reason + ")" }

// GRPCStatus lets grpc-go send the code, and the leader hint of a
// NOT_LEADER answer as an errdetails.ErrorInfo detail.
func (e *apiError) GRPCStatus() *status.Status { return e.grpcStatus() }

func apiErr(code codes.Code, reason, format string, a ...any) error {
	return &apiError{code: code, reason: reason, msg: fmt.Sprintf(format, a...)}
}

// ctxErr turns a context's end into an API error matching the gRPC code.
func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &apiError{code: codes.DeadlineExceeded, reason: ReasonCancelled, msg: "deadline exceeded"}
	}
	return &apiError{code: codes.Canceled, reason: ReasonCancelled, msg: "cancelled"}
}

func (s *Server) checkKey(key string) error {
	switch {
	case len(key) == 0:
		return apiErr(codes.InvalidArgument, ReasonInvalidKey, "invalid key: empty")
	case len(key) > s.cfg.MaxKeyBytes:
		return apiErr(codes.InvalidArgument, ReasonInvalidKey, "invalid key: %d bytes > %d", len(key), s.cfg.MaxKeyBytes)
	case !utf8.ValidString(key):
		return apiErr(codes.InvalidArgument, ReasonInvalidKey, "invalid key: not valid UTF-8")
	case strings.IndexByte(key, 0) >= 0:
		return apiErr(codes.InvalidArgument, ReasonInvalidKey, "invalid key: contains NUL")
	}
	return nil
}

// MaxHolderBytes is the longest holder description an acquisition may
// carry, in bytes: the same limit as the client's (driver.MaxHolderBytes).
const MaxHolderBytes = 256

// MaxReasonBytes is the longest reason a force release may carry, in bytes.
const MaxReasonBytes = 1024

// checkText validates a free-text field shown to people (a holder
// description, a force release's reason): at most max bytes of valid UTF-8
// without control characters (unicode.IsControl: C0, DEL and C1, newline and
// tab included), the client's rule for holders (driver.CheckHolder). A
// newline or an escape sequence would forge lines and colours in logs,
// "dlock status" and "dlock list". Every transport (gRPC, Session, HTTP)
// goes through it, so all refuse the same input with the same reason:
// InvalidArgument, INVALID_REQUEST, "invalid <what>: ...".
func checkText(what, s string, max int) error {
	const rule = "at most %d bytes of UTF-8 without control characters"
	if len(s) > max {
		return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid %s: %d bytes ("+rule+")", what, len(s), max)
	}
	if !utf8.ValidString(s) {
		return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid %s: not valid UTF-8 ("+rule+")", what, max)
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid %s: control character %U at byte %d ("+rule+")", what, r, i, max)
		}
	}
	return nil
}

// minToken is the shortest owner token or session accepted, in bytes: a
// token short enough to guess would let a stranger release a grant. (The
// dlock client sends 32 hex digits, 128 random bits.)
const minToken = 8

// checkToken validates an owner token or session: minToken to 128 bytes of
// printable ASCII without spaces.
func checkToken(what, t string) error {
	if len(t) < minToken || len(t) > 128 {
		return apiErr(codes.InvalidArgument, ReasonInvalidOwner, "invalid %s: %d bytes, want %d to 128", what, len(t), minToken)
	}
	for i := 0; i < len(t); i++ {
		if t[i] < 0x21 || t[i] > 0x7e {
			return apiErr(codes.InvalidArgument, ReasonInvalidOwner, "invalid %s: byte %d is not printable ASCII", what, i)
		}
	}
	return nil
}

// ttlOrDefault validates a TTL; zero (unset) means def.
func (s *Server) ttlOrDefault(ttl, def time.Duration) (time.Duration, error) {
	if ttl == 0 {
		return def, nil
	}
	if ttl < s.cfg.MinTTL || ttl > s.cfg.MaxTTL {
		return 0, apiErr(codes.InvalidArgument, ReasonInvalidTTL, "invalid TTL %v: outside [%v, %v]", ttl, s.cfg.MinTTL, s.cfg.MaxTTL)
	}
	return ttl, nil
}

// raftErr maps a Raft error to an API error.
func (s *Server) raftErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return s.notLeader("not the leader: %v", err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return apiErr(codes.Unavailable, ReasonShuttingDown, "shutting down")
	default:
		return s.notLeader("raft: %v", err)
	}
}

// writable returns nil when the node serves writes.
func (s *Server) writable() error {
	select {
	case <-s.closing:
		return apiErr(codes.Unavailable, ReasonShuttingDown, "shutting down")
	default:
	}
	if s.removed.Load() {
		return s.removedErr()
	}
	if i := s.diverged.Load(); i != 0 {
		return s.divergedErr(i)
	}
	if !s.ready.Load() {
		// The hint names the leader, or this node itself when it is the
		// leader still catching up (a client retries it after a pause).
		return s.notLeader("not ready: not the leader or catching up")
	}
	return nil
}

// acquireIn is one acquisition request, validated by acquire.
type acquireIn struct {
	key, owner, holder, session string
	ttl                         time.Duration
	wait                        bool
	lockDelay                   time.Duration // with hasLockDelay: the request's own lock-delay
	hasLockDelay                bool
	// shared asks for a Shared grant of limit permits (0: any number, the
	// read side of a read-write lock); see shared.go.
	shared bool
	limit  uint32
}

// acquireOut is a grant.
type acquireOut struct {
	key, owner  string
	fence       uint64
	ttl         time.Duration
	claimWithin time.Duration // a handed-over grant: confirm with a renewal within this
}

// errWaitCancelled is returned by acquire when the client cancelled the
// wait through the cancel channel; nothing is left on the server.
var errWaitCancelled = apiErr(codes.Canceled, ReasonCancelled, "wait cancelled by the client")

// validateAcquire checks in and fills its defaults (TTL, owner token,
// lock-delay).
func (s *Server) validateAcquire(in *acquireIn) error {
	var err error
	if err = s.checkKey(in.key); err != nil {
		return err
	}
	if in.ttl, err = s.ttlOrDefault(in.ttl, s.cfg.DefaultTTL); err != nil {
		return err
	}
	if in.owner == "" {
		in.owner = newToken()
	} else if err = checkToken("owner", in.owner); err != nil {
		return err
	}
	if in.session != "" {
		if err = checkToken("session", in.session); err != nil {
			return err
		}
	}
	if err = checkText("holder", in.holder, MaxHolderBytes); err != nil {
		return err
	}
	switch {
	case !in.shared && in.limit != 0:
		return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid limit %d: an exclusive acquisition has no permit limit (set shared, or leave limit 0)", in.limit)
	case in.limit > MaxPermits:
		return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid limit %d: want 0 (any number of shared grants) to %d permits", in.limit, MaxPermits)
	}
	switch {
	case !in.hasLockDelay:
		in.lockDelay = min(s.cfg.LockDelay, in.ttl)
	case in.lockDelay < 0 || in.lockDelay > in.ttl:
		return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid lock_delay %v: want 0 to the TTL (%v)", in.lockDelay, in.ttl)
	}
	return nil
}

// acquire grants in.key to in.owner, or queues and waits when in.wait. The
// wait ends with the grant, or with ctx, cancel or shutdown; in these cases
// the queue entry (or a grant that raced) is removed before it returns.
// onQueued, when not nil, is called once with the queue position.
//
// A try (no wait) of a key that is held by another owner, in a lock-delay,
// or that the same owner waits for already, is refused from the leader's
// state after a linearizable read: a refusal changes nothing and costs no
// log entry and no disk write.
//
// With in.wait, the request's goroutine parks for the whole wait, which may
// last hours, so it must keep a small stack: a goroutine's stack keeps the
// size of its deepest call, and the proposal and grpc-go's send path (in
// onQueued) doubled what a waiter cost, 16 KiB of stack where 8 KiB hold
// the parked frames of a gRPC or HTTP handler. So when the key is held
// (the request will likely queue), beginAcquire and onQueued run on a
// pooled worker whose stack is grown already (callPool.do, which raises a
// panic of theirs again here), and the request's goroutine parks in
// awaitGrant. A wait for a free key, granted at once, runs inline: the
// hand-off cost about 5% of uncontended throughput.
// TestLoad_ParkedStreamStacks measures it.
func (s *Server) acquire(ctx context.Context, in acquireIn, cancel <-chan struct{}, onQueued func(int)) (acquireOut, error) {
	if in.wait && s.fsm.wouldRefuse(in.key, in.owner, in.shared, int(in.limit)) {
		return s.acquireParked(ctx, in, cancel, onQueued) // likely to queue: park small
	}
	// Likely granted at once: no hand-off (a race that queues it parks on
	// a larger stack), and no closure, so nothing of this path escapes to
	// the heap.
	q, out, err := s.beginAndNotify(ctx, in, false, onQueued)
	if err != nil || q == nil {
		return out, err
	}
	return s.awaitGrant(ctx, q, cancel)
}

// acquireParked is acquire for a request that will likely queue: its first
// part runs on a pooled worker (see acquire).
func (s *Server) acquireParked(ctx context.Context, in acquireIn, cancel <-chan struct{}, onQueued func(int)) (acquireOut, error) {
	var q *queuedAcquire
	var out acquireOut
	var err error
	s.calls.do(func() { q, out, err = s.beginAndNotify(ctx, in, true, onQueued) })
	if err != nil || q == nil {
		return out, err
	}
	return s.awaitGrant(ctx, q, cancel)
}

// beginAndNotify is beginAcquire, then onQueued (when not nil) with the
// queue position of a queued request. A panic of onQueued leaves nothing
// behind (the wait registration, the queue entry or a grant that raced:
// awaitGrant will not run) and goes on to the caller's recovery.
func (s *Server) beginAndNotify(ctx context.Context, in acquireIn, likelyQueued bool, onQueued func(int)) (*queuedAcquire, acquireOut, error) {
	q, out, err := s.beginAcquire(ctx, in, likelyQueued)
	if err == nil && q != nil && onQueued != nil {
		defer func() {
			if p := recover(); p != nil {
				s.waits.remove(q.ko, q.w)
				_ = s.undo(q.ko)
				panic(p)
			}
		}()
		onQueued(q.position)
	}
	return q, out, err
}

// queuedAcquire is an acquisition that beginAcquire queued: its wait entry
// and the grant to fill in. awaitGrant waits for it and removes the entry.
type queuedAcquire struct {
	ko       keyOwner
	w        *waitEntry
	out      acquireOut
	position int
}

// beginAcquire is the first part of acquire: it validates in, proposes the
// acquisition and returns its answer, or, when the request was queued, a
// queuedAcquire for awaitGrant (and a zero acquireOut). likelyQueued is
// acquire's guess that the request will queue (a wait for a held key): its
// proposal then waits for company (proposeQueued).
func (s *Server) beginAcquire(ctx context.Context, in acquireIn, likelyQueued bool) (*queuedAcquire, acquireOut, error) {
	callPanicHook("beginAcquire")
	if err := s.validateAcquire(&in); err != nil {
		return nil, acquireOut{}, err
	}
	if err := s.writable(); err != nil {
		return nil, acquireOut{}, err
	}
	if err := s.checkLimit(&in); err != nil {
		return nil, acquireOut{}, err
	}
	if !in.wait && s.fsm.wouldRefuse(in.key, in.owner, in.shared, int(in.limit)) {
		// The local table says no: confirm it linearizably (still the
		// leader, everything committed applied), then refuse without a log
		// entry. A key that looks free goes straight to the log, which
		// decides; so a try of a free key costs no extra round.
		if err := s.readBarrier(); err != nil {
			return nil, acquireOut{}, err
		}
		if v, ok := s.fsm.peek(in.key, in.owner); ok && s.fsm.wouldRefuse(in.key, in.owner, in.shared, int(in.limit)) {
			s.lockMetrics.contended.Inc()
			return nil, acquireOut{}, s.refusal(in.key, v)
		}
	}
	ko := keyOwner{in.key, in.owner}
	var w *waitEntry
	if in.wait {
		var ok bool
		if w, ok = s.waits.add(ko); !ok {
			return nil, acquireOut{}, apiErr(codes.AlreadyExists, ReasonDuplicateWait, "acquire %q: owner is already waiting", in.key)
		}
	}
	queued := false
	defer func() {
		if w != nil && !queued { // awaitGrant removes a queued request's entry
			s.waits.remove(ko, w)
		}
	}()
	c := &command{
		op: opAcquire, key: in.key, owner: in.owner, holder: in.holder, session: in.session,
		ttl: in.ttl, lockDelay: in.lockDelay, wait: in.wait, shared: in.shared, limit: uint64(in.limit),
		maxWaiters: uint64(s.cfg.MaxWaitersPerKey), maxLeases: uint64(s.cfg.MaxLeases), maxTotalWaiters: uint64(s.cfg.MaxWaiters),
	}
	// A direct call (not through a func value), so that c stays on the
	// stack.
	var r applyResult
	var err error
	if likelyQueued {
		r, err = s.proposeQueued(c) // it will likely queue: ride with the next entry (propose.go)
	} else {
		r, err = s.propose(c)
	}
	if err != nil {
		return nil, acquireOut{}, err
	}
	out := acquireOut{key: in.key, owner: in.owner, ttl: in.ttl}
	switch r.code {
	case resGranted:
		if ctx.Err() != nil { // nobody will hear of the grant: leave nothing behind
			s.undo(ko)
			return nil, acquireOut{}, ctxErr(ctx)
		}
		out.fence = r.fence
		out.ttl = r.ttl
		return nil, out, nil
	case resHeld:
		s.lockMetrics.contended.Inc()
		return nil, acquireOut{}, apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held", in.key)
	case resDelayed:
		s.lockMetrics.contended.Inc()
		return nil, acquireOut{}, apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (in its lock-delay after a lost grant)", in.key)
	case resTooManyWaiters:
		return nil, acquireOut{}, apiErr(codes.ResourceExhausted, ReasonTooManyWaiters, "acquire %q: %d waiters already queued on the key", in.key, s.cfg.MaxWaitersPerKey)
	case resTooManyQueued:
		return nil, acquireOut{}, apiErr(codes.ResourceExhausted, ReasonTooManyWaiters, "acquire %q: the server holds its maximum of %d queue entries", in.key, s.cfg.MaxWaiters)
	case resTooManyLeases:
		return nil, acquireOut{}, apiErr(codes.ResourceExhausted, ReasonTooManyLeases, "acquire %q: server holds its maximum of %d leases", in.key, s.cfg.MaxLeases)
	case resBadLimit:
		return nil, acquireOut{}, apiErr(codes.InvalidArgument, ReasonLimitMismatch, "acquire %q: the key's shared grants have a permit limit of %s, not %s", in.key, limitText(r.limit), limitText(int(in.limit)))
	case resQueued:
		if w == nil { // cannot happen: a try of a queued owner is refused by the FSM
			return nil, acquireOut{}, apiErr(codes.Internal, ReasonInternal, "acquire %q: queued without waiting", in.key)
		}
		s.lockMetrics.contended.Inc()
	default:
		return nil, acquireOut{}, apiErr(codes.Internal, ReasonInternal, "acquire %q: unexpected result %d", in.key, r.code)
	}
	queued = true
	return &queuedAcquire{ko: ko, w: w, out: out, position: r.position}, acquireOut{}, nil
}

// awaitGrant waits for the grant of q, queued by beginAcquire, until ctx,
// cancel or shutdown, and removes its wait entry. Its frames are kept
// small (see acquire); the clean-up after a wait that ended without a
// grant runs deeper, once.
func (s *Server) awaitGrant(ctx context.Context, q *queuedAcquire, cancel <-chan struct{}) (acquireOut, error) {
	defer s.waits.remove(q.ko, q.w)
	out := q.out
	var why error
	select {
	case g := <-q.w.ch:
		if ctx.Err() == nil {
			// The grant's TTL, not the request's: the queue entry may be
			// an earlier request's, with another TTL.
			out.fence, out.ttl = g.fence, g.ttl
			out.claimWithin = s.cfg.ClaimWindow
			return out, nil
		}
		why = ctxErr(ctx)
	case <-ctx.Done():
		why = ctxErr(ctx)
	case <-cancel:
		why = errWaitCancelled
	case <-q.w.gone:
		return acquireOut{}, s.waitEntryRemoved(q.ko.key)
	case <-s.closing:
		return acquireOut{}, s.shutdownWhileWaiting(q.ko.key)
	}
	return acquireOut{}, s.endWait(q.ko, why)
}

// waitEntryRemoved is the answer to a wait whose entry a CancelWait from
// another call (POST /v1/cancel-wait, the driver's clean-up on another
// connection) or a purge removed: no grant will come, and there is nothing
// to undo.
func (s *Server) waitEntryRemoved(key string) error {
	return apiErr(codes.Canceled, ReasonCancelled, "acquire %q: the queue entry was removed (cancel-wait) while this request waited", key)
}

// shutdownWhileWaiting is the answer to a wait when the server shuts down.
// The queue entry stays: the next leader (this node restarted, or another
// member) keeps it for its grace period, so the client that re-sends the
// same request (same key and owner token) there keeps its place. A client
// that does not is purged after it.
func (s *Server) shutdownWhileWaiting(key string) error {
	return apiErr(codes.Unavailable, ReasonShuttingDown,
		"acquire %q: server shutting down; the queue entry keeps its place for its TTL: send the same request (same owner) to the next leader", key)
}

// endWait removes the queue entry (or a grant that raced) of a wait that
// ended for why, and returns why, or the error of the removal.
func (s *Server) endWait(ko keyOwner, why error) error {
	if err := s.undo(ko); err != nil {
		// The entry may still be queued (this node lost its leadership):
		// the answer must not say it was removed.
		return err
	}
	return why
}

// refusal is the answer to a try that found key held by another owner, in a
// lock-delay, or already waited for by the same owner.
func (s *Server) refusal(key string, v holderView) error {
	if v.shared || v.delayed > 0 {
		return sharedRefusal(key, v)
	}
	if !v.held {
		if left, ok := s.clock.delayRemaining(key); ok {
			return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (in its lock-delay after a lost grant, %v left)", key, left.Round(time.Millisecond))
		}
		return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (in its lock-delay after a lost grant)", key)
	}
	if v.queued {
		return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (this owner is queued for it)", key)
	}
	return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held", key)
}

// undo removes owner's queue entry on key, or releases its grant that raced
// a cancellation.
func (s *Server) undo(ko keyOwner) error {
	_, err := s.propose(&command{op: opCancelWait, key: ko.key, owner: ko.owner})
	return err
}

// release ends owner's grant on key and returns the fence handed to the next
// waiter (0 when none).
func (s *Server) release(key, owner string) (uint64, error) {
	if err := s.checkKey(key); err != nil {
		return 0, err
	}
	if err := checkToken("owner", owner); err != nil {
		return 0, err
	}
	if err := s.writable(); err != nil {
		return 0, err
	}
	r, err := s.propose(&command{op: opRelease, key: key, owner: owner})
	if err != nil {
		return 0, err
	}
	if r.code == resLost {
		return 0, apiErr(codes.NotFound, ReasonLeaseLost, "release %q: not the holder", key)
	}
	return r.fence, nil
}

// cancelWait is undo as an API call.
func (s *Server) cancelWait(key, owner string) (applyResult, error) {
	if err := s.checkKey(key); err != nil {
		return applyResult{}, err
	}
	if err := checkToken("owner", owner); err != nil {
		return applyResult{}, err
	}
	if err := s.writable(); err != nil {
		return applyResult{}, err
	}
	return s.propose(&command{op: opCancelWait, key: key, owner: owner})
}

// renewIn is one renewal.
type renewIn struct {
	key, owner string
	ttl        time.Duration // 0: keep
}

// renew extends each grant to a full TTL, all or nothing on validation: an
// invalid item fails the whole request and changes nothing. The result
// slice tells, per item, whether it was renewed (false: lease lost).
//
// Renewals whose TTL is unchanged only move this leader's in-memory
// deadline, after a VerifyLeader round that started after the call (shared
// with concurrent renewals and reads: readindex.go) confirmed that a quorum
// still follows it; see the package doc. A renewal with a new TTL, or of a
// suspect grant, goes through the log.
func (s *Server) renew(items []renewIn) ([]bool, error) {
	if len(items) > s.cfg.MaxRenewBatch {
		return nil, apiErr(codes.ResourceExhausted, ReasonTooLarge, "renew: %d items > %d", len(items), s.cfg.MaxRenewBatch)
	}
	for i := range items {
		it := &items[i]
		if err := s.checkKey(it.key); err != nil {
			return nil, err
		}
		if err := checkToken("owner", it.owner); err != nil {
			return nil, err
		}
		if it.ttl != 0 {
			if _, err := s.ttlOrDefault(it.ttl, 0); err != nil {
				return nil, err
			}
		}
	}
	if err := s.writable(); err != nil {
		return nil, err
	}
	if _, err := s.verifyLeader(); err != nil {
		return nil, err
	}
	if s.transferring.Load() > 0 {
		return nil, s.notLeader("renew: leadership transfer in progress")
	}
	now := s.clock.now()
	ok := make([]bool, len(items))
	for i, it := range items {
		switch s.clock.renew(it.key, it.owner, it.ttl, now) {
		case renewOK:
			ok[i] = true
		case renewNeedsLog:
			// A new TTL, or a suspect grant (ttl 0: the FSM keeps the
			// grant's TTL): the renewal restarts the grant through the
			// log, and is acknowledged once committed.
			r, err := s.propose(&command{op: opSetTTL, key: it.key, owner: it.owner, ttl: it.ttl})
			if err != nil {
				return nil, err
			}
			ok[i] = r.code == resOK
		}
		if !ok[i] {
			s.lockMetrics.renewFailures.Inc()
		}
	}
	return ok, nil
}

// readBarrier makes a following read of the FSM linearizable: this node is
// still the leader, and everything committed before the call is applied.
// It writes nothing: it waits until the FSM has applied the commit index
// read after a VerifyLeader round that started after the call (one round
// serves concurrent reads and renewals: readindex.go). Every entry after a leader's first no-op command
// reaches the FSM (commands and configuration changes; Raft's barriers and
// no-ops come only before it, in becomeLeader), so the wait ends when the
// entries in flight are applied. A Raft barrier here used to write an entry
// the FSM never sees, which left the next read behind again: after a
// restart every read wrote and fsynced one.
func (s *Server) readBarrier() error {
	if err := s.writable(); err != nil {
		return err
	}
	target, err := s.verifyLeader()
	if err != nil {
		return err
	}
	if s.transferring.Load() > 0 {
		return s.notLeader("read: leadership transfer in progress")
	}
	var timeout <-chan time.Time
	for {
		applied, wake := s.fsm.appliedIndex()
		if applied >= target {
			return nil
		}
		if timeout == nil {
			t := time.NewTimer(s.cfg.ApplyTimeout)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-wake:
		case <-timeout:
			return apiErr(codes.Unavailable, ReasonNotLeader, "read: the lock table did not catch up with the log (applied %d, committed %d) within %v", applied, target, s.cfg.ApplyTimeout)
		case <-s.closing:
			return apiErr(codes.Unavailable, ReasonShuttingDown, "shutting down")
		}
	}
}

// holderOut describes one grant, or a key in its lock-delay.
type holderOut struct {
	key          string
	fence        uint64
	holder       string
	ttl          time.Duration
	remaining    time.Duration
	hasRemaining bool
	waiters      int
	delayLeft    time.Duration // not held: the lock-delay's time left
	inDelay      bool
	// A Shared key (shared.go): its permit limit (0: any number), its
	// live Shared grants (the fields above describe the oldest), those
	// lost and in their lock-delay, and (inspect) each live one.
	shared        bool
	limit         int
	holders       int
	delayed       int
	grants        []holderOut
	removedGrants int // force release: the grants removed
}

func (s *Server) describe(v holderView) holderOut {
	h := holderOut{key: v.key, fence: v.grant.fence, holder: v.grant.holder(), ttl: v.grant.ttl, waiters: v.waiters}
	if !v.held {
		h.delayLeft, _ = s.clock.delayRemaining(v.key)
		for _, o := range v.lostOwners { // only lost Shared grants: the longest of their lock-delays
			if left, ok := s.clock.sharedDelayRemaining(v.key, o); ok {
				h.delayLeft = max(h.delayLeft, left)
			}
		}
		h.inDelay = true
		return h
	}
	h.remaining, h.hasRemaining = s.clock.remainingOf(v.key, v.grant.owner, v.grant.fence)
	s.describeShared(v, &h)
	return h
}

// inspect describes key's grant; held is false when the key is free or in
// its lock-delay (then out.inDelay is set, with its waiters).
func (s *Server) inspect(key string) (holderOut, bool, error) {
	if err := s.checkKey(key); err != nil {
		return holderOut{}, false, err
	}
	if err := s.readBarrier(); err != nil {
		return holderOut{}, false, err
	}
	v, ok := s.fsm.get(key)
	if !ok {
		return holderOut{key: key}, false, nil
	}
	return s.describe(v), v.held, nil
}

// list describes up to limit held keys starting with prefix, sorted (a key
// with Shared grants as one entry per live grant, by fence, never split
// over pages: limit counts entries, and a page holds at least one key), from
// the page that pageToken names (empty: the first), and returns the token of
// the next page ("" after the last). Its cost is the page's, not the
// table's: the FSM walks its ordered table. With an auth file it scans
// only the key ranges ctx's identity may read (readRanges), so every key
// it reads, returns or names in a page token is readable by the caller; a
// page token naming any other string just starts the walk after it.
func (s *Server) list(ctx context.Context, prefix, pageToken string, limit int) ([]holderOut, string, error) {
	if len(prefix) > s.cfg.MaxKeyBytes || !utf8.ValidString(prefix) {
		return nil, "", apiErr(codes.InvalidArgument, ReasonInvalidKey, "invalid prefix: more than %d bytes or not UTF-8", s.cfg.MaxKeyBytes)
	}
	if limit <= 0 {
		limit = min(1000, s.cfg.MaxListLimit)
	}
	if limit > s.cfg.MaxListLimit {
		return nil, "", apiErr(codes.InvalidArgument, ReasonInvalidRequest, "list limit %d > %d", limit, s.cfg.MaxListLimit)
	}
	after, err := decodePageToken(pageToken, s.cfg.MaxKeyBytes)
	if err != nil {
		return nil, "", err
	}
	if err := s.readBarrier(); err != nil {
		return nil, "", err
	}
	// Only the ranges the caller may read are scanned (auth.go), so the
	// page and its token name readable keys alone.
	vs, more := s.fsm.listIn(s.readRanges(ctx, prefix), after, limit)
	out := make([]holderOut, 0, len(vs))
	for _, v := range vs {
		h := s.describe(v)
		if !h.shared || len(h.grants) == 0 {
			out = append(out, h)
			continue
		}
		// A key with Shared grants: one entry per live grant, by fence
		// (at most maxInspectGrants; each says how many there are).
		out = append(out, h.grants[:min(len(h.grants), maxInspectGrants)]...)
	}
	next := ""
	if more && len(vs) > 0 {
		next = base64.RawURLEncoding.EncodeToString([]byte(vs[len(vs)-1].key))
	}
	return out, next, nil
}

// decodePageToken returns the key a list page token names: the last key of
// the previous page, base64url-encoded.
func decodePageToken(tok string, maxKey int) (string, error) {
	if tok == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) == 0 || len(b) > maxKey || !utf8.Valid(b) {
		return "", apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid page_token: pass the next_page_token of the previous page")
	}
	return string(b), nil
}

// checkFence says whether fence is key's current grant, and returns the
// current fence (0 when free).
func (s *Server) checkFence(key string, fence uint64) (bool, uint64, error) {
	if err := s.checkKey(key); err != nil {
		return false, 0, err
	}
	if fence == 0 {
		return false, 0, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "check fence %q: fence 0 is never issued", key)
	}
	if err := s.readBarrier(); err != nil {
		return false, 0, err
	}
	v, ok := s.fsm.get(key)
	if !ok || !v.held {
		return false, 0, nil
	}
	for _, g := range v.grants { // a Shared key: any of its live grants is current
		if g.fence == fence {
			return true, fence, nil
		}
	}
	return v.grant.fence == fence, v.grant.fence, nil
}

// ReasonNotHeld is the reason of a force release of a key that is free.
const ReasonNotHeld = "NOT_HELD"

// forceRelease removes key's grant whoever holds it (an operator's
// override), and returns the grant removed and the fence handed to the next
// waiter (0: none, or the key entered its lock-delay). The holder's Watch
// streams hear LOST (FORCE_RELEASED) when the entry is applied. reason is
// required and logged.
func (s *Server) forceRelease(key, reason string) (holderOut, uint64, error) {
	if err := s.checkKey(key); err != nil {
		return holderOut{}, 0, err
	}
	reason = strings.TrimSpace(reason)
	if reason == "" {
		return holderOut{}, 0, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "force release %q: a reason (1 to %d bytes of UTF-8 without control characters) is required", key, MaxReasonBytes)
	}
	if err := checkText("reason", reason, MaxReasonBytes); err != nil {
		return holderOut{}, 0, err
	}
	if err := s.writable(); err != nil {
		return holderOut{}, 0, err
	}
	r, err := s.propose(&command{op: opForceRelease, key: key})
	if err != nil {
		return holderOut{}, 0, err
	}
	if r.code == resLost {
		return holderOut{}, 0, apiErr(codes.NotFound, ReasonNotHeld, "force release %q: not held", key)
	}
	g := r.removed
	s.lockMetrics.forceReleased.Add(float64(max(r.nremoved, 1)))
	s.log.Info("dlockd: grant force-released", "key", key, "fence", g.fence, "holder", g.holder(), "reason", reason, "next_fence", r.fence, "grants", max(r.nremoved, 1))
	return holderOut{key: key, fence: g.fence, holder: g.holder(), ttl: g.ttl, removedGrants: r.nremoved}, r.fence, nil
}
