package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// redisSetScript stores ARGV[1] as the value of hash KEYS[1] with fence
// ARGV[2] only when ARGV[2] is greater than the stored fence, comparing the
// decimal strings exactly (Lua numbers are doubles and lose precision above
// 2^53). It returns {1} when stored, {0, stored fence} when stale.
var redisSetScript = redis.NewScript(`
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

// RedisSet stores value under key, atomically, only when fence f is greater
// than the fence stored with the key's current value; otherwise it changes
// nothing and returns an error wrapping ErrStaleFence. The key holds a hash
// with the fields "value" and "fence" (read them with RedisGet). client is
// any go-redis client that runs scripts (*redis.Client, *redis.ClusterClient,
// *redis.Ring). value is any value go-redis accepts as an argument.
//
// The fence is kept with the value, so it is exactly as durable as the
// value: a Redis that loses the key (no persistence, failover to a replica
// that missed the write) forgets the fence too, and then accepts a stale
// writer again.
func RedisSet(ctx context.Context, client redis.Scripter, key string, value any, f uint64) error {
	if f == 0 {
		return fmt.Errorf("fence: redis set %q: fence 0 is not a fence", key)
	}
	res, err := redisSetScript.Run(ctx, client, []string{key}, value, strconv.FormatUint(f, 10)).Slice()
	if err != nil {
		return fmt.Errorf("fence: redis set %q: %w", key, err)
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
	return fmt.Errorf("fence: redis set %q with fence %d: stored fence is %s: %w", key, f, stored, ErrStaleFence)
}

// RedisHashGetter is what RedisGet needs: *redis.Client,
// *redis.ClusterClient and *redis.Ring implement it.
type RedisHashGetter interface {
	HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd
}

// ErrNoValue is returned by RedisGet when the key holds no fenced value.
var ErrNoValue = errors.New("fence: no fenced value")

// RedisGet returns the value stored by RedisSet under key and its fence, or
// an error wrapping ErrNoValue when there is none.
func RedisGet(ctx context.Context, client RedisHashGetter, key string) (value string, f uint64, err error) {
	vals, err := client.HMGet(ctx, key, "value", "fence").Result()
	if err != nil {
		return "", 0, fmt.Errorf("fence: redis get %q: %w", key, err)
	}
	v, ok1 := vals[0].(string)
	fs, ok2 := vals[1].(string)
	if !ok1 || !ok2 {
		return "", 0, fmt.Errorf("fence: redis get %q: %w", key, ErrNoValue)
	}
	f, err = strconv.ParseUint(fs, 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("fence: redis get %q: fence %q: %w", key, fs, err)
	}
	return v, f, nil
}
