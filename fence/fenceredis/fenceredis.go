// Package fenceredis keeps a Redis value that only a newer dlock fence can
// overwrite (see package fence for why), with go-redis.
//
// Set stores a value under a key only with a fence greater than the one
// stored with it, atomically, in one Lua script; Get reads both:
//
//	err := fenceredis.Set(ctx, client, "report", contents, lease.Fence())
//	if errors.Is(err, dlock.ErrStaleFence) { … a newer holder has written: stop … }
//
// It is a package of its own so that a program that fences SQL writes does
// not link go-redis (package fence/fencesql has no Redis in it).
package fenceredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/fence"
)

// ErrStaleFence is fence.ErrStaleFence (and dlock.ErrStaleFence), the same
// value: Set was refused because the key holds a value with an equal or
// greater fence.
var ErrStaleFence = fence.ErrStaleFence

// ErrNoValue is returned (wrapped) by Get when the key holds no fenced
// value.
var ErrNoValue = errors.New("fenceredis: no fenced value")

// setScript stores ARGV[1] as the value of hash KEYS[1] with fence ARGV[2]
// only when ARGV[2] is greater than the stored fence, comparing the decimal
// strings exactly (Lua numbers are doubles and lose precision above 2^53).
// It returns {1} when stored, {0, stored fence} when stale.
var setScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'fence')
local new = ARGV[2]
if cur then
	if #cur > #new or (#cur == #new and cur >= new) then
		return {0, cur}
	end
end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'fence', new)
return {1}
`)

// Set stores value under key, atomically, only when fence f is greater than
// the fence stored with the key's current value; otherwise it changes
// nothing and returns an error wrapping ErrStaleFence. The key holds a hash
// with the fields "value" and "fence" (read them with Get). client is any
// go-redis client that runs scripts (*redis.Client, *redis.ClusterClient,
// *redis.Ring). value is any value go-redis accepts as an argument. Fence 0
// is an error; so is a failing Redis call (its error, wrapped).
//
// The fence is kept with the value, so it is exactly as durable as the
// value: a Redis that loses the key (no persistence, failover to a replica
// that missed the write) forgets the fence too, and then accepts a stale
// writer again.
func Set(ctx context.Context, client redis.Scripter, key string, value any, f uint64) error {
	if f == 0 {
		return fmt.Errorf("fenceredis: set %q: fence 0 is not a fence", key)
	}
	res, err := setScript.Run(ctx, client, []string{key}, value, strconv.FormatUint(f, 10)).Slice()
	if err != nil {
		return fmt.Errorf("fenceredis: set %q: %w", key, err)
	}
	if len(res) > 0 {
		if ok, _ := res[0].(int64); ok == 1 {
			return nil
		}
	}
	stored := "?"
	if len(res) > 1 {
		stored = fmt.Sprint(res[1])
	}
	return fmt.Errorf("fenceredis: set %q with fence %d: stored fence is %s: %w", key, f, stored, ErrStaleFence)
}

// HashGetter is what Get needs: *redis.Client, *redis.ClusterClient and
// *redis.Ring implement it.
type HashGetter interface {
	HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd
}

// Get returns the value stored by Set under key and its fence, an error
// wrapping ErrNoValue when there is none, or the Redis call's error,
// wrapped.
func Get(ctx context.Context, client HashGetter, key string) (value string, f uint64, err error) {
	vals, err := client.HMGet(ctx, key, "value", "fence").Result()
	if err != nil {
		return "", 0, fmt.Errorf("fenceredis: get %q: %w", key, err)
	}
	v, ok1 := vals[0].(string)
	fs, ok2 := vals[1].(string)
	if !ok1 || !ok2 {
		return "", 0, fmt.Errorf("fenceredis: get %q: %w", key, ErrNoValue)
	}
	f, err = strconv.ParseUint(fs, 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("fenceredis: get %q: fence %q: %w", key, fs, err)
	}
	return v, f, nil
}
