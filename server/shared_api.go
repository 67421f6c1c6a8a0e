package server

// shared_api.go holds the API side of Shared grants (shared.go): the
// answers of refused Shared requests and how a Shared key is described by
// Inspect and List.

import (
	"strconv"

	"google.golang.org/grpc/codes"
)

// ReasonLimitMismatch: a Shared acquisition asked for another permit limit
// than the key's Shared grants or waiters have (INVALID_ARGUMENT; the
// message names the key's limit).
const ReasonLimitMismatch = "LIMIT_MISMATCH"

// limitText spells a permit limit: "N" or "0 (unlimited)".
func limitText(n int) string {
	if n == 0 {
		return "0 (unlimited)"
	}
	return strconv.Itoa(n)
}

// sharedRefusal is the answer to a try refused on a key with Shared
// grants: what holds it.
func sharedRefusal(key string, v holderView) error {
	switch {
	case v.queued:
		return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (this owner is queued for it)", key)
	case v.limit > 0 && v.holders+v.delayed >= v.limit:
		if v.delayed > 0 {
			return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (all %d permits taken, %d of them by lost grants in their lock-delay)", key, v.limit, v.delayed)
		}
		return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (all %d permits taken)", key, v.limit)
	case v.waiters > 0:
		return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (%d shared grants, %d waiters queued first)", key, v.holders, v.waiters)
	case v.delayed > 0:
		return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (%d shared grants, %d lost grants in their lock-delay)", key, v.holders, v.delayed)
	}
	return apiErr(codes.FailedPrecondition, ReasonLockHeld, "acquire %q: lock held (%d shared grants)", key, v.holders)
}

// describeShared adds to h what v says of a Shared key: its limit, counts
// and (from get) each live grant with the time it has left.
func (s *Server) describeShared(v holderView, h *holderOut) {
	if !v.shared {
		return
	}
	h.shared, h.limit, h.holders, h.delayed = true, v.limit, v.holders, v.delayed
	for _, g := range v.grants {
		o := holderOut{key: v.key, fence: g.fence, holder: g.holder(), ttl: g.ttl, waiters: v.waiters, shared: true, limit: v.limit, holders: v.holders, delayed: v.delayed}
		o.remaining, o.hasRemaining = s.clock.remainingOf(v.key, g.owner, g.fence)
		h.grants = append(h.grants, o)
	}
}

// maxInspectGrants is the most Shared grants an Inspect answer lists (the
// oldest first); HolderInfo.holders always counts them all.
const maxInspectGrants = 1000

// checkLimit refuses, without a log entry, a Shared acquisition whose
// limit differs from the key's (after a linearizable read confirms it). The
// FSM refuses one that races a change of the key the same way
// (resBadLimit).
func (s *Server) checkLimit(in *acquireIn) error {
	if !in.shared {
		return nil
	}
	if l, ok := s.fsm.sharedLimit(in.key); !ok || l == int(in.limit) {
		return nil
	}
	if err := s.readBarrier(); err != nil {
		return err
	}
	if l, ok := s.fsm.sharedLimit(in.key); ok && l != int(in.limit) {
		return apiErr(codes.InvalidArgument, ReasonLimitMismatch, "acquire %q: the key's shared grants have a permit limit of %s, not %s", in.key, limitText(l), limitText(int(in.limit)))
	}
	return nil
}
