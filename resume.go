package dlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// LeaseToken identifies one grant so that another process (a restarted
// one) can re-attach to it with Locker.Resume while the store still holds
// it. Its fields are the grant's key, owner token, fencing token and TTL.
//
// It serialises to JSON as {"key":…,"owner":…,"fence":…,"ttl":"30s"} (the
// TTL as a Go duration string), and MarshalText/UnmarshalText use that same
// form, so it can be written to a file or an environment variable (dlock
// run --resume-file does). Unmarshalling checks the token (Check) and
// refuses a malformed one with ErrInvalidArgument.
//
// The owner token is the grant's credential: whoever has it can renew and
// release the grant. Keep a token where only the holder can read it (dlock
// run writes its file with mode 0600).
type LeaseToken struct {
	// Key is the lock name.
	Key string
	// Owner is the grant's owner token (Lease.Owner).
	Owner string
	// Fence is the grant's fencing token (Lease.Fence), > 0.
	Fence uint64
	// TTL is the lease's time to live (Lease.TTL), in [MinTTL, MaxTTL].
	TTL time.Duration
}

// Token returns the lease's LeaseToken, for Locker.Resume in another
// process. A degraded lease (WithFailOpen) has no grant on the store: its
// token has Fence 0, which Resume refuses with ErrInvalidArgument.
func (ls *Lease) Token() LeaseToken {
	return LeaseToken{Key: ls.key, Owner: ls.owner, Fence: ls.fence, TTL: ls.TTL()}
}

// Check returns nil when the token is well formed (a valid key and owner
// token, a fence > 0, a TTL in [MinTTL, MaxTTL]), else an error matching
// ErrInvalidArgument (ErrInvalidKey or ErrInvalidTTL where they apply) that
// names the field. It says nothing of whether the store still holds the
// grant: Resume asks the store.
func (t LeaseToken) Check() error {
	if err := ValidateKey(t.Key); err != nil {
		return fmt.Errorf("lease token: %w", err)
	}
	if err := driver.CheckOwner(t.Owner); err != nil {
		return fmt.Errorf("lease token: %w", err)
	}
	if t.Fence == 0 {
		return fmt.Errorf("lease token: %w: fence 0 (a degraded lease, or no grant), want > 0", ErrInvalidArgument)
	}
	if err := ValidateTTL(t.TTL); err != nil {
		return fmt.Errorf("lease token: %w", err)
	}
	return nil
}

type tokenJSON struct {
	Key   string `json:"key"`
	Owner string `json:"owner"`
	Fence uint64 `json:"fence"`
	TTL   string `json:"ttl"`
}

// MarshalJSON encodes the token as {"key","owner","fence","ttl"}, the TTL
// as a Go duration string ("30s").
func (t LeaseToken) MarshalJSON() ([]byte, error) {
	return json.Marshal(tokenJSON{Key: t.Key, Owner: t.Owner, Fence: t.Fence, TTL: t.TTL.String()})
}

// UnmarshalJSON decodes what MarshalJSON encodes and checks the result
// (Check); a malformed token is an error matching ErrInvalidArgument, and t
// is left unchanged then.
func (t *LeaseToken) UnmarshalJSON(b []byte) error {
	var j tokenJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("lease token: %w: %w", ErrInvalidArgument, err)
	}
	ttl, err := time.ParseDuration(j.TTL)
	if err != nil {
		return fmt.Errorf("lease token: %w: ttl %q is not a duration", ErrInvalidTTL, j.TTL)
	}
	tok := LeaseToken{Key: j.Key, Owner: j.Owner, Fence: j.Fence, TTL: ttl}
	if err := tok.Check(); err != nil {
		return err
	}
	*t = tok
	return nil
}

// MarshalText is MarshalJSON.
func (t LeaseToken) MarshalText() ([]byte, error) { return t.MarshalJSON() }

// UnmarshalText is UnmarshalJSON.
func (t *LeaseToken) UnmarshalText(b []byte) error { return t.UnmarshalJSON(b) }

// ResultResumed is the AcquireEvent.Result of a successful Resume. A
// Resume that finds the grant gone (ErrLeaseLost) reports
// ResultNotAcquired, one the store cannot do (ErrUnsupported)
// ResultInvalid; other failures as for Acquire.
const ResultResumed = "resumed"

// Resume re-attaches to the grant tok names — typically one a previous run
// of this program acquired before it was restarted — after confirming on
// the store that tok.Owner still holds tok.Key by the grant of fence
// tok.Fence (driver.Resumer); the store renews the grant to a full TTL in
// the same step. The Lease returned behaves as any other: same key, owner
// token and fence, a heartbeat, a validity deadline measured from the
// moment the Resume request was sent (sent + TTL − drift), a context
// cancelled on loss, pushed loss where the store pushes it, observer events
// (AcquireDone with Result "resumed", renewals, the end), and Release or the
// Locker's Close end it.
//
// The TTL is the token's. Other options apply as to Acquire (WithHeartbeat,
// WithDrift, WithOpTimeout, WithHolder, WithKeyClass, WithObserver,
// WithMaxHold, which counts from the resumption). One attempt is made,
// bounded by the op timeout; on any error nothing on the store changes, so
// Resume may be called again.
//
// Resume through a Locker of the same kind as the one that made the lease:
// a plain lock's token through a Locker of the store, a recipe's shared
// grant (a native semaphore permit, a read lock) through a View of the same
// kind, where that view's driver is a Resumer; a plain Locker does not find
// a shared grant (ErrLeaseLost).
//
// Resume a token only where its first Lease is gone (the process that held
// it exited or was killed): a Lease still alive for the same grant (in
// this process or another) keeps renewing it, and whichever of the two is
// released first ends the grant for both, the other then being lost at its
// next renewal.
//
// Errors: ErrInvalidArgument (or ErrInvalidKey, ErrInvalidTTL) for a
// malformed token (Check) or invalid options, before any store call;
// ErrUnsupported, naming the store, when the store's grants die with the
// session that made them (ZooKeeper, PostgreSQL advisory locks: the driver
// is no driver.Resumer); ErrLeaseLost when the grant expired, was
// released, was taken over, or is held by the owner with another fence;
// ErrUnavailable when the store did not answer; ErrClosed; an error
// matching ctx.Err() when ctx ended.
func (l *Locker) Resume(ctx context.Context, tok LeaseToken, opts ...Option) (lease *Lease, err error) {
	start := time.Now()
	o := l.callOptions(opts)
	o.ttl = tok.TTL
	defer func() {
		res := resultOf(lease, err)
		switch {
		case err == nil:
			res = ResultResumed
		case errors.Is(err, ErrLeaseLost):
			res = ResultNotAcquired // the grant is gone: not had
		case errors.Is(err, ErrUnsupported):
			res = ResultInvalid // the store cannot: retrying cannot help
		}
		l.observer(o).AcquireDone(AcquireEvent{Store: l.store, KeyClass: o.keyClass, Result: res, Latency: time.Since(start)})
	}()
	if err := tok.Check(); err != nil {
		return nil, l.wrap("resume", tok.Key, err)
	}
	if ctx == nil {
		return nil, l.wrap("resume", tok.Key, errNilContext)
	}
	if err := validateOptions(o); err != nil {
		return nil, l.wrap("resume", tok.Key, err)
	}
	if l.isClosed() {
		return nil, l.wrap("resume", tok.Key, ErrClosed)
	}
	r, ok := l.drv.(driver.Resumer)
	if !ok {
		return nil, l.wrap("resume", tok.Key, fmt.Errorf("%w: the %s store cannot resume a lease (its grants end with the session that made them, or its driver has no driver.Resumer)", ErrUnsupported, l.store))
	}
	req := driver.AcquireRequest{Key: tok.Key, Owner: tok.Owner, TTL: tok.TTL, Holder: o.holder}
	sent := time.Now()
	octx, cancel := l.opContext(ctx, o)
	g, err := r.Resume(octx, req, tok.Fence)
	cancel()
	if err != nil {
		if errors.Is(err, ErrClosed) || (l.closeCtx.Err() != nil && ctx.Err() == nil) {
			return nil, l.wrap("resume", tok.Key, ErrClosed)
		}
		return nil, l.classify("resume", tok.Key, ctx, err)
	}
	if g.Fence != tok.Fence {
		// A driver that answered with another grant: not the lease the
		// token names. Give nothing back as held.
		return nil, l.wrap("resume", tok.Key, fmt.Errorf("%w: the store answered fence %d for a token of fence %d", ErrLeaseLost, g.Fence, tok.Fence))
	}
	ls, err := l.newLease(req, g, sent, o)
	if err != nil {
		return nil, err
	}
	return ls, nil
}
