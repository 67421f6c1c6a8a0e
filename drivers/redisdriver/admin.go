package redisdriver

import (
	"context"
	"fmt"
	"strconv"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.ForceReleaser = (*Driver)(nil)

// ForceRelease removes key's current grant whoever holds it (dlock release
// --force) and returns what it removed. It reads the grant, then deletes it
// only if the same grant (by fence) is still there, so a grant made in
// between is never removed. The fence counter only grows, so the next
// grant's fence is still greater. It returns an error matching
// driver.ErrNotAcquired when key is free or its grant changed meanwhile, or
// the store's error wrapped. reason is not stored: Redis keeps no audit log
// (the root package logs it with the removed grant).
//
// It runs the release script (the fence in place of the owner token): a
// waiter queued on the key (Wait) is handed the key in the same script, as
// by the holder's own release, instead of finding it free at its next poll.
// The release hint it publishes (when Options.ReleaseHints is on) also
// reaches the removed grant's holder, if its driver watches the grant
// (Grant.Recheck): the holder renews at once, is refused, and learns of the
// loss within a round trip instead of at its next renewal.
func (d *Driver) ForceRelease(ctx context.Context, key, reason string) (driver.HolderInfo, error) {
	info, err := d.Inspect(ctx, key)
	if err != nil {
		return driver.HolderInfo{}, err
	}
	keys, channel := d.lockKeys(key)
	if !d.hints {
		channel = ""
	}
	n, err := releaseScript.Run(ctx, d.client, keys, "", channel, handoffClaimMs, strconv.FormatUint(info.Fence, 10)).Int64()
	if err != nil {
		return driver.HolderInfo{}, storeErr(ctx, "force-release", err)
	}
	if n != 1 {
		return driver.HolderInfo{}, fmt.Errorf("redisdriver: force-release: the grant changed meanwhile: %w", driver.ErrNotAcquired)
	}
	return info, nil
}
