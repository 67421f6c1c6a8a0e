package redisdriver

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.ForceReleaser = (*Driver)(nil)

// ARGV: fence, hint channel or "". Deletes the lock hash only while it still
// holds the grant with that fence. Returns 1, or 0 when the grant changed.
var forceReleaseScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'fence') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then
    redis.call('PUBLISH', ARGV[2], 'released')
  end
  return 1
end
return 0
`)

// ForceRelease removes key's current grant whoever holds it (dlock release
// --force) and returns what it removed. It reads the grant, then deletes it
// only if the same grant (by fence) is still there, so a grant made in
// between is never removed. The fence counter is untouched, so the next
// grant's fence is still greater. It returns an error matching
// driver.ErrNotAcquired when key is free or its grant changed meanwhile, or
// the store's error wrapped. reason is not stored: Redis keeps no audit log
// (the root package logs it with the removed grant).
//
// The release hint it publishes (when Options.ReleaseHints is on) also
// reaches the removed grant's holder, if its driver watches the grant
// (Grant.Recheck): the holder renews at once, is refused, and learns of the
// loss within a round trip instead of at its next renewal.
func (d *Driver) ForceRelease(ctx context.Context, key, reason string) (driver.HolderInfo, error) {
	info, err := d.Inspect(ctx, key)
	if err != nil {
		return driver.HolderInfo{}, err
	}
	lock, _, channel := d.keys(key)
	if !d.hints {
		channel = ""
	}
	n, err := forceReleaseScript.Run(ctx, d.client, []string{lock}, strconv.FormatUint(info.Fence, 10), channel).Int64()
	if err != nil {
		return driver.HolderInfo{}, storeErr(ctx, "force-release", err)
	}
	if n != 1 {
		return driver.HolderInfo{}, fmt.Errorf("redisdriver: force-release: the grant changed meanwhile: %w", driver.ErrNotAcquired)
	}
	return info, nil
}
