package dlockddriver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/driver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// CheckFence reports whether fence is the current grant of key on the
// server (Chubby's sequencer check). It is weaker than a resource that
// stores the greatest fence it has seen: the answer can be stale by the time
// the caller acts on it.
func (d *Driver) CheckFence(ctx context.Context, key string, fence uint64) (bool, error) {
	if err := driver.CheckKey(key); err != nil {
		return false, fmt.Errorf("dlockd: checkfence: %w", err)
	}
	if d.isClosed() {
		return false, driver.ErrClosed
	}
	var resp *dlockv1.CheckFenceResponse
	_, err := d.call(ctx, callOpts{}, func(ctx context.Context, c dlockv1.LockClient) (err error) {
		resp, err = c.CheckFence(ctx, &dlockv1.CheckFenceRequest{Key: key, Fence: fence})
		return err
	})
	if err != nil {
		return false, mapErr(ctx, "check fence", key, err)
	}
	return resp.GetCurrent(), nil
}

// Inspect implements driver.Inspector. For a free key it returns
// driver.ErrNotAcquired wrapped together with a HolderInfo carrying the
// key's queued waiters and, when the key is in its lock-delay, the delay's
// time left (HolderInfo.LockDelay).
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("dlockd: inspect: %w", err)
	}
	if d.isClosed() {
		return driver.HolderInfo{}, driver.ErrClosed
	}
	var resp *dlockv1.InspectResponse
	_, err := d.call(ctx, callOpts{}, func(ctx context.Context, c dlockv1.LockClient) (err error) {
		resp, err = c.Inspect(ctx, &dlockv1.InspectRequest{Key: key})
		return err
	})
	if err != nil {
		return driver.HolderInfo{}, mapErr(ctx, "inspect", key, err)
	}
	if !resp.GetHeld() {
		// A free key: its waiters, and the lock-delay's time left when it
		// is in one (grants refused until then).
		info := driver.HolderInfo{Key: key, Waiters: int(resp.GetWaiters())}
		if d := resp.GetLockDelayRemaining(); d != nil && d.AsDuration() > 0 {
			info.LockDelay = d.AsDuration()
		}
		return info, fmt.Errorf("dlockd: inspect %q: %w", key, driver.ErrNotAcquired)
	}
	return holderInfo(resp.GetInfo()), nil
}

// errPaging is returned by List when the server hands back the page token
// it was given, which would loop forever.
var errPaging = errors.New("the server returned the same page token twice")

// List implements driver.Inspector. It reads page after page (of
// Options.ListPageSize holders, or the server's default) until the server
// says there are no more, so it returns every held key with prefix, sorted
// by key; ctx bounds the whole listing. Each page is a linearizable read,
// but the pages are read one after another: a key granted or released
// meanwhile may be missing or still listed.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	if d.isClosed() {
		return nil, driver.ErrClosed
	}
	var out []driver.HolderInfo
	token := ""
	for {
		var resp *dlockv1.ListResponse
		_, err := d.call(ctx, callOpts{}, func(ctx context.Context, c dlockv1.LockClient) (err error) {
			resp, err = c.List(ctx, &dlockv1.ListRequest{Prefix: prefix, Limit: d.pageSize, PageToken: token})
			return err
		})
		if err != nil {
			return nil, mapErr(ctx, "list", prefix, err)
		}
		for _, h := range resp.GetHolders() {
			out = append(out, holderInfo(h))
		}
		next := resp.GetNextPageToken()
		if next == "" {
			return out, nil
		}
		if next == token {
			return nil, fmt.Errorf("dlockd: list %q: %w (%q)", prefix, errPaging, next)
		}
		token = next
	}
}

func holderInfo(h *dlockv1.HolderInfo) driver.HolderInfo {
	return driver.HolderInfo{
		Key: h.GetKey(), Fence: h.GetFence(), Holder: h.GetHolder(),
		TTL: h.GetTtl().AsDuration(), Remaining: h.GetRemaining().AsDuration(),
		Waiters: int(min(h.GetWaiters(), math.MaxInt32)),
	}
}

// ForceRelease implements driver.ForceReleaser with the server's
// ForceRelease RPC: it removes key's grant whoever holds it and returns the
// grant removed. The server keeps reason in its log, tells the holder's
// session at once (its Grant.Lost closes), lets the key's lock-delay run,
// and then grants the next waiter with a greater fence. It returns an error
// matching driver.ErrNotAcquired when key is free, driver.ErrInvalidKey for
// a key the server refuses, errors.ErrUnsupported from a dlockd older than
// the RPC, a plain error when reason is empty, and the connection's error
// otherwise (dlock.ErrUnavailable at the root). It is never retried by the
// driver (a repeat could remove the grant the key was handed to next): on a
// leader change it fails, and the operator asks again.
func (d *Driver) ForceRelease(ctx context.Context, key, reason string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("dlockd: forcerelease: %w", err)
	}
	if d.isClosed() {
		return driver.HolderInfo{}, driver.ErrClosed
	}
	if strings.TrimSpace(reason) == "" {
		return driver.HolderInfo{}, fmt.Errorf("dlockd: force-release %q: a reason is required", key)
	}
	// Not idempotent: a repeat after an attempt whose answer was lost
	// could remove the next holder's grant. One attempt; a NOT_LEADER hint
	// only moves the next call (a follower forwards it to the leader).
	var resp *dlockv1.ForceReleaseResponse
	_, err := d.call(ctx, callOpts{once: true}, func(ctx context.Context, c dlockv1.LockClient) (err error) {
		resp, err = c.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: key, Reason: reason})
		return err
	})
	switch status.Code(err) {
	case codes.NotFound: // NOT_HELD: the only NOT_FOUND of this RPC
		return driver.HolderInfo{}, fmt.Errorf("dlockd: force-release %q: the key is free: %w", key, driver.ErrNotAcquired)
	case codes.Unimplemented:
		return driver.HolderInfo{}, fmt.Errorf("dlockd: force-release %q: the server is older than force release: %w", key, errors.ErrUnsupported)
	}
	if err != nil {
		return driver.HolderInfo{}, mapErr(ctx, "force-release", key, err)
	}
	return holderInfo(resp.GetRemoved()), nil
}
