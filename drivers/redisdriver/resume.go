package redisdriver

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// resumeScript resets the expiry of the lock hash KEYS[1] to ARGV[2] ms
// only while it holds the owner token ARGV[1] with the fence ARGV[3]. It
// returns 1 (resumed), 0 (the key is free), -1 (another owner holds it) or
// -2 (the owner holds it by another fence: not the grant named).
var resumeScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if v[1] == false then return 0 end
if v[1] ~= ARGV[1] then return -1 end
if v[2] ~= ARGV[3] then return -2 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[1], 'ttl', ARGV[2])
return 1
`)

// Resume implements driver.Resumer: a grant lives in its lock hash, not in
// the connection that made it, so any driver on the same Redis (and
// prefix) can re-attach to it. One script checks, atomically, that the
// hash still holds req.Owner with the fence, and resets its expiry to
// req.TTL; otherwise it returns driver.ErrLeaseLost and changes nothing.
// The holder description is kept. The resumed grant gets the recheck
// subscription of a fresh one (Grant.Recheck, with release hints on).
// With Options.WaitReplicas, the resumption is reported only once that
// many replicas acknowledged it; otherwise it returns an error matching
// driver.ErrUnavailable and leaves the grant held, with the expiry the
// primary set, so that Resume may be called again.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if err := d.checkOpen(); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("redisdriver: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("redisdriver: resume: %w: fence 0", driver.ErrInvalidArgument)
	}
	s, err := d.session("resume")
	if err != nil {
		return driver.Grant{}, err
	}
	defer s.close()
	lock, _, _ := d.keys(req.Key)
	n, err := resumeScript.Run(ctx, s.c, []string{lock}, req.Owner, req.TTL.Milliseconds(), fmt.Sprint(fence)).Int64()
	if err != nil {
		return driver.Grant{}, storeErr(ctx, "resume", err)
	}
	switch n {
	case 1:
		// A shortfall leaves the grant as it is (a renewal's rule): it was
		// made, and maybe replicated, by the run that acquired it, and
		// Resume may be called again.
		if err := d.replicated(ctx, s, "resume", "the resumed grant"); err != nil {
			return driver.Grant{}, err
		}
		return driver.Grant{Fence: fence, Recheck: d.watch(req.Key, req.Owner, req.TTL)}, nil
	case 0:
		return driver.Grant{}, fmt.Errorf("%w (the key is free: the grant expired or was released)", driver.ErrLeaseLost)
	case -1:
		return driver.Grant{}, fmt.Errorf("%w (another owner holds the key)", driver.ErrLeaseLost)
	default:
		return driver.Grant{}, fmt.Errorf("%w (the owner holds the key by another fence than %d)", driver.ErrLeaseLost, fence)
	}
}
