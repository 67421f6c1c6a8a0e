package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Baseline is what a lock round trip can cost on this machine, measured in
// the same run as the stores, so that the stores' figures can be read as
// ratios (absolute figures on a shared machine move by ±30% between runs):
//
//   - RawRedis and RawRedisContended: the W1 and W2 loops written with
//     go-redis alone, no dlock code: SET key token NX PX for the grant and
//     the compare-and-delete Lua script for the release, each client its
//     own connection. W2's waiters poll SET NX in a loop with no pause: the
//     fastest a polling client can hand a key over, at the cost of a
//     server kept busy. This is the speed of light for a lock round trip
//     here, and it has no lease renewal, no fence and no durability.
//   - RawEtcd and RawZK: W1 with etcd's and ZooKeeper's official clients
//     alone, the lightest correct lock round trip each store allows (see
//     RawEtcdUncontended and RawZKUncontended): the base of the etcd and
//     zk drivers' "× raw recipe".
//   - Limits: a loopback TCP round trip, and an appended 4 KiB write with
//     fdatasync in the directory a durable store writes to: a durable
//     handoff costs at least one of each.
type Baseline struct {
	RawRedis          []Uncontended `json:"raw_redis"`
	RawRedisContended []Contended   `json:"raw_redis_contended"`
	RawEtcd           []Uncontended `json:"raw_etcd,omitempty"`
	RawZK             []Uncontended `json:"raw_zk,omitempty"`
	Limits            Limits        `json:"limits"`
}

// empty reports whether b holds no measurement.
func (b Baseline) empty() bool {
	return b.Limits == (Limits{}) && len(b.RawRedis) == 0 && len(b.RawRedisContended) == 0 && len(b.RawEtcd) == 0 && len(b.RawZK) == 0
}

// Limits are the machine's physical limits for a lock round trip.
type Limits struct {
	LoopbackRTTP50Us float64 `json:"loopback_rtt_p50_us"`
	LoopbackRTTP99Us float64 `json:"loopback_rtt_p99_us"`
	FsyncP50Us       float64 `json:"fsync_p50_us"` // a 4 KiB append + fdatasync
	FsyncP99Us       float64 `json:"fsync_p99_us"`
	FsyncDir         string  `json:"fsync_dir"`
}

// HandoffLimit is the one-durable-write-per-handoff limit, in handoffs per
// second: 1 / (fdatasync p50 + loopback round trip p50). 0 when either was
// not measured.
func (l Limits) HandoffLimit() float64 {
	if l.FsyncP50Us <= 0 || l.LoopbackRTTP50Us <= 0 {
		return 0
	}
	return 1e6 / (l.FsyncP50Us + l.LoopbackRTTP50Us)
}

// releaseScript is the release of the Redis lock recipe: delete the key
// only if it still holds the caller's token.
var releaseScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

// rawRedisClients opens n go-redis clients of one connection each to addr,
// with the release script loaded.
func rawRedisClients(ctx context.Context, addr string, n int) ([]*redis.Client, func(), error) {
	cs := make([]*redis.Client, 0, n)
	closeAll := func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}
	for range n {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MinIdleConns: 1})
		if err := c.Ping(ctx).Err(); err != nil {
			_ = c.Close()
			closeAll()
			return nil, nil, fmt.Errorf("bench: raw Redis at %s: %w", addr, err)
		}
		cs = append(cs, c)
	}
	if err := releaseScript.Load(ctx, cs[0]).Err(); err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("bench: raw Redis: load the release script: %w", err)
	}
	return cs, closeAll, nil
}

// dropRawKeys deletes a raw cell's keys (this run's own: no one else uses
// them) with a fresh context bounded by releaseTimeout, so that a cell cut
// off midway (Ctrl-C between a SET NX and its release, whose context had
// ended) leaves none behind to expire 30 s later.
func dropRawKeys(ctx context.Context, c *redis.Client, keys ...string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_ = c.Del(dctx, keys...).Err()
}

func token() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// errNotGranted is a raw SET NX that found the key held (W1's own keys
// are never held: an error).
var errNotGranted = errors.New("bench: raw Redis: SET NX refused an own key")

// RawRedisUncontended runs W1 with go-redis alone against the Redis server
// at addr: n clients, each on its own key, SET NX PX then the release
// script, in a loop for d. Store is "raw-redis".
func RawRedisUncontended(ctx context.Context, addr string, n int, d time.Duration) (Uncontended, error) {
	cs, closeAll, err := rawRedisClients(ctx, addr, n)
	if err != nil {
		return Uncontended{}, err
	}
	defer closeAll()
	keys, toks := make([]string, n), make([]string, n)
	for i := range keys {
		keys[i], toks[i] = fmt.Sprintf("bench:raw:w1:%s:%d:%d", runID, n, i), token()
	}
	defer dropRawKeys(ctx, cs[0], keys...)
	return cycles(ctx, "raw-redis", n, d, func(i int) (time.Duration, error) {
		t0 := time.Now()
		ok, err := cs[i].SetNX(ctx, keys[i], toks[i], 30*time.Second).Result()
		if err == nil && !ok {
			err = errNotGranted
		}
		if err != nil {
			return 0, err
		}
		took := time.Since(t0)
		return took, releaseScript.EvalSha(ctx, cs[i], []string{keys[i]}, toks[i]).Err()
	}), ctx.Err()
}

// RawRedisContended runs W2 with go-redis alone against the Redis server at
// addr: n clients on one key, each polling SET NX PX with no pause until it
// is granted, then releasing with the release script, in a loop for d.
// Store is "raw-redis".
func RawRedisContended(ctx context.Context, addr string, n int, d time.Duration) (Contended, error) {
	cs, closeAll, err := rawRedisClients(ctx, addr, n)
	if err != nil {
		return Contended{}, err
	}
	defer closeAll()
	key := fmt.Sprintf("bench:raw:w2:%s:%d", runID, n)
	defer dropRawKeys(ctx, cs[0], key)
	w := newHandoffs(n)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := token()
			for time.Now().Before(end) && ctx.Err() == nil {
				t0 := time.Now()
				for {
					ok, err := c.SetNX(ctx, key, tok, 30*time.Second).Result()
					if err != nil {
						if ctx.Err() == nil {
							w.errs.Add(1)
						}
						return
					}
					if ok {
						break
					}
					if !time.Now().Before(end) {
						return
					}
				}
				w.granted(i, t0, time.Now())
				if err := releaseScript.EvalSha(ctx, c, []string{key}, tok).Err(); err != nil {
					w.errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return w.result("raw-redis", time.Since(start)), ctx.Err()
}

// MeasureLimits measures a loopback TCP round trip (n one-byte ping-pongs
// on one connection) and n appended 4 KiB writes, each followed by
// fdatasync, to a file in dir (removed after).
func MeasureLimits(ctx context.Context, dir string, n int) (Limits, error) {
	l := Limits{FsyncDir: dir}
	rtt, err := loopbackRTT(ctx, n)
	if err != nil {
		return l, err
	}
	l.LoopbackRTTP50Us, l.LoopbackRTTP99Us = pctUs(rtt, 0.50), pctUs(rtt, 0.99)
	fs, err := fsyncLatency(ctx, dir, n)
	if err != nil {
		return l, err
	}
	l.FsyncP50Us, l.FsyncP99Us = pctUs(fs, 0.50), pctUs(fs, 0.99)
	return l, nil
}

func loopbackRTT(ctx context.Context, n int) ([]time.Duration, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c) // echo until the client closes
		served <- err
	}()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		return nil, err
	}
	d := make([]time.Duration, 0, n)
	b := []byte{1}
	for range n {
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		if _, err := c.Write(b); err != nil {
			_ = c.Close()
			return nil, err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			_ = c.Close()
			return nil, err
		}
		d = append(d, time.Since(t0))
	}
	_ = c.Close()
	if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
		return nil, err
	}
	return d, ctx.Err()
}

func fsyncLatency(ctx context.Context, dir string, n int) ([]time.Duration, error) {
	f, err := os.CreateTemp(dir, "bench-fsync-*")
	if err != nil {
		return nil, fmt.Errorf("bench: fsync latency: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	d := make([]time.Duration, 0, n)
	for range n {
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			return nil, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return nil, fmt.Errorf("bench: fdatasync in %s: %w", filepath.Dir(f.Name()), err)
		}
		d = append(d, time.Since(t0))
	}
	return d, ctx.Err()
}
