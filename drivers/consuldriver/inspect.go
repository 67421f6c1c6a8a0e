package consuldriver

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/dlock-dev/dlock/driver"
)

// holderInfo describes the grant in the lock entry kv of key.
func holderInfo(key string, kv *api.KVPair, waiters int) driver.HolderInfo {
	info := driver.HolderInfo{Key: key, Fence: kv.ModifyIndex, Waiters: waiters}
	if r, ok := decodeRecord(kv.Value); ok {
		info.Holder = r.Holder
		info.TTL = time.Duration(r.TTLns)
	}
	return info
}

// liveWaiters counts the queue entries in entries that a live session holds,
// by escaped key (the path element after d.queue).
func (d *Driver) liveWaiters(entries api.KVPairs) map[string]int {
	n := map[string]int{}
	for _, e := range entries {
		if e.Session == "" {
			continue
		}
		rest := strings.TrimPrefix(e.Key, d.queue)
		if i := strings.IndexByte(rest, '/'); i > 0 {
			n[rest[:i]]++
		}
	}
	return n
}

// Inspect implements driver.Inspector: it reads the key's entry and counts
// its queued waiters. Fence is the grant's Raft index, TTL the lease's;
// Remaining is 0 (Consul does not tell a session's time left). A free key
// returns ErrNotAcquired wrapped, with Key and Waiters set.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("consuldriver: inspect: %w", err)
	}
	if d.isClosed() {
		return driver.HolderInfo{}, driver.ErrClosed
	}
	kv, _, err := d.read(ctx, d.lockKey(key))
	if err != nil {
		return driver.HolderInfo{}, d.storeErr("inspect", err)
	}
	entries, _, err := d.kv.List(d.queueDirOf(key), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return driver.HolderInfo{}, d.storeErr("inspect", err)
	}
	waiters := d.liveWaiters(entries)[escapeKey(key)]
	if kv == nil || kv.Session == "" {
		return driver.HolderInfo{Key: key, Waiters: waiters}, fmt.Errorf("consuldriver: inspect %q: %w", key, driver.ErrNotAcquired)
	}
	return holderInfo(key, kv, waiters), nil
}

// List implements driver.Inspector: the held keys that start with prefix,
// sorted by key bytes, each with its queued waiters counted. Entries under
// the prefix that the driver did not write are skipped.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	if d.isClosed() {
		return nil, driver.ErrClosed
	}
	kvs, _, err := d.kv.List(d.locks+escapeKey(prefix), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, d.storeErr("list", err)
	}
	var out []driver.HolderInfo
	var waiters map[string]int
	for _, kv := range kvs {
		if kv.Session == "" {
			continue
		}
		name := strings.TrimPrefix(kv.Key, d.locks)
		key, ok := unescapeKey(name)
		if !ok || driver.CheckKey(key) != nil || !strings.HasPrefix(key, prefix) {
			continue
		}
		if waiters == nil {
			entries, _, err := d.kv.List(d.queue, (&api.QueryOptions{}).WithContext(ctx))
			if err != nil {
				return nil, d.storeErr("list", err)
			}
			waiters = d.liveWaiters(entries)
		}
		out = append(out, holderInfo(key, kv, waiters[name]))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// ForceRelease implements driver.ForceReleaser: it destroys the holder's
// session, as "consul session destroy" does, so Consul releases (or
// deletes) the entry and applies that session's lock-delay. The holder
// finds the loss at its next renewal. reason is not recorded: Consul keeps
// no log of it.
func (d *Driver) ForceRelease(ctx context.Context, key, reason string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("consuldriver: force release: %w", err)
	}
	if d.isClosed() {
		return driver.HolderInfo{}, driver.ErrClosed
	}
	kv, _, err := d.read(ctx, d.lockKey(key))
	if err != nil {
		return driver.HolderInfo{}, d.storeErr("force release", err)
	}
	if kv == nil || kv.Session == "" {
		return driver.HolderInfo{Key: key, Waiters: -1}, fmt.Errorf("consuldriver: force release %q: %w", key, driver.ErrNotAcquired)
	}
	if _, err := d.sess.Destroy(kv.Session, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return driver.HolderInfo{}, d.storeErr("force release", err)
	}
	return holderInfo(key, kv, -1), nil
}
