package redlockdriver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// resumeCheckScript, on one node, reads only: when the lock key KEYS[1]
// holds the owner token ARGV[1], it returns the node's fence counter
// KEYS[2] (≥ 0); it returns -2 when the key is missing and -1 when another
// owner holds it. See Resume.
var resumeCheckScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false then return -2 end
if cur ~= ARGV[1] then return -1 end
return tonumber(redis.call('GET', KEYS[2]) or '0')
`)

// errNodeBelowFence: the node holds the owner's key but its fence counter
// is below the token's fence.
var errNodeBelowFence = errors.New("fence counter below the token's fence")

// Resume implements driver.Resumer: a Redlock grant lives in its lock keys
// on the nodes, not in the connection that made it, so another driver on
// the same nodes (and prefix) can re-attach to it. Two rounds, each on
// every node in parallel, bounded by the node timeout:
//
//  1. A read of each node's lock key and fence counter, which changes
//     nothing. The resume goes on when a majority of the nodes holds the
//     owner's key (a missing key never counts, as for Renew) and at least
//     one of them has a fence counter of at least fence; otherwise Resume
//     returns driver.ErrLeaseLost (a *QuorumError, or the fence's
//     refusal), or driver.ErrUnavailable when too few nodes answered,
//     having written nothing.
//  2. The renewal: each node of the owner's gets its key's expiry reset to
//     req.TTL and fence written to its counter ("set if greater", as
//     renewals do), and a node where the key is missing gets it again, so
//     the grant is what a fresh one is. Unless a majority of the nodes
//     confirms it, Resume returns driver.ErrLeaseLost (another owner took
//     the key meanwhile) or driver.ErrUnavailable: the keys renewed then
//     expire by req.TTL, as after a failed acquisition.
//
// The nodes keep the owner token of a grant, not its fence, so the fence is
// the token's: Resume checks only that it is not above every counter of the
// owner's majority (which holds the grant's real fence, since the grant put
// it on a majority and two majorities meet). A token whose fence was
// altered downwards is accepted and hurts only its holder (the resource
// refuses its writes); upwards it is refused unless other keys sharing the
// counter raised it that far, and even then every later grant of the key
// draws a greater fence.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, fmt.Errorf("redlockdriver: resume %q: %w", req.Key, driver.ErrClosed)
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("redlockdriver: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("redlockdriver: resume: %w: fence 0", driver.ErrInvalidArgument)
	}
	start := time.Now()
	nto := d.nodeTimeout(req.TTL)
	keys := []string{d.lockKey(req.Key), d.fenceKey(req.Key)}
	ttlMS := max(req.TTL.Milliseconds(), 1)
	var reached atomic.Bool // a node of the owner's has a counter ≥ fence
	errs := d.each(ctx, nto, func(ctx context.Context, i int, c redis.Scripter) error {
		n, err := resumeCheckScript.Run(ctx, c, keys, req.Owner).Int64()
		if err != nil {
			return err
		}
		switch {
		case n == -2:
			return errNodeMissing
		case n < 0:
			return errNodeHeld
		case uint64(n) < fence:
			return errNodeBelowFence
		}
		reached.Store(true)
		return nil
	})
	// A node below the fence still holds the owner's key: it counts
	// toward the majority, not toward "the fence was issued".
	owned := count(errs, nil) + count(errs, errNodeBelowFence)
	if owned < d.quorum {
		if against := count(errs, errNodeHeld) + count(errs, errNodeMissing); len(d.nodes)-against < d.quorum {
			return driver.Grant{}, fmt.Errorf("redlockdriver: resume %q: %w", req.Key, d.quorumErr("resume", errs, driver.ErrLeaseLost))
		}
		return driver.Grant{}, fmt.Errorf("redlockdriver: resume %q: %w", req.Key, d.quorumErr("resume", errs, d.failure(errs)))
	}
	if !reached.Load() {
		return driver.Grant{}, fmt.Errorf("redlockdriver: resume %q: %w: fence %d is above every fence counter of the owner's nodes, so it was never issued for this grant", req.Key, driver.ErrLeaseLost, fence)
	}
	// The renewal, with the fence, onto the owner's nodes, and the key
	// onto missing ones; a majority must confirm it.
	fenceArg := strconv.FormatUint(fence, 10)
	renewed := d.each(ctx, nto, func(ctx context.Context, i int, c redis.Scripter) error {
		script := renewScript
		switch {
		case errors.Is(errs[i], errNodeMissing):
			script = repairScript
		case errs[i] != nil && !errors.Is(errs[i], errNodeBelowFence):
			return errs[i] // another owner's, or no answer: not renewed
		}
		n, err := script.Run(ctx, c, keys, req.Owner, ttlMS, fenceArg).Int64()
		switch {
		case err != nil:
			return err
		case n == 1:
			return nil
		case n == 2:
			return errNodeMissing
		}
		return errNodeHeld
	})
	if ok := count(renewed, nil); ok < d.quorum {
		if against := count(renewed, errNodeHeld) + count(renewed, errNodeMissing); len(d.nodes)-against < d.quorum {
			return driver.Grant{}, fmt.Errorf("redlockdriver: resume %q: %w", req.Key, d.quorumErr("resume", renewed, driver.ErrLeaseLost))
		}
		return driver.Grant{}, fmt.Errorf("redlockdriver: resume %q: %w", req.Key, d.quorumErr("resume", renewed, d.failure(renewed)))
	}
	d.mu.Lock()
	d.fences[grantKey(req.Key, req.Owner)] = fenceOf{fence: fence, until: start.Add(req.TTL)}
	d.mu.Unlock()
	return driver.Grant{Fence: fence}, nil
}
