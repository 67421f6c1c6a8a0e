// Package redisledger is a once.Ledger in Redis: one hash per (job,
// window), written by Lua scripts that compare fences exactly (as decimal
// strings, like fence/fenceredis), so a stale holder's start or finish
// changes nothing and reports ErrStaleFence.
//
// # The clock
//
// Now is the Redis server's clock (TIME), one clock for every node,
// whatever their own clocks say; the scripts stamp the start and finish
// with it too.
//
// # Durability
//
// The ledger is as durable as Redis: a Redis without persistence (or a
// failover to a replica that missed the write) forgets the records, and a
// window that finished may then run again. Run Redis with appendonly yes
// (appendfsync always for no loss at all), or use recipe/once/sqlledger.
// Records are kept for ever unless Options.Retention is set.
//
// # Keys
//
// The hash of (job, window) is Prefix + "{" + job + "}:" + window, with
// job's "%", "{" and "}" percent-escaped so that the hash tag cannot end
// early: every window of a job is in one Redis Cluster hash slot. Fields:
// state, fence, owner, node, attempt, started_us, finished_us (microseconds
// on the server's clock), error.
package redisledger

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/recipe/once"
)

// DefaultPrefix is the prefix of the ledger's keys when Options.Prefix is
// empty.
const DefaultPrefix = "dlock:once:"

// Client is what the ledger needs from go-redis: *redis.Client,
// *redis.ClusterClient and *redis.Ring implement it.
type Client interface {
	redis.Scripter
	HGetAll(ctx context.Context, key string) *redis.MapStringStringCmd
	Time(ctx context.Context) *redis.TimeCmd
}

// Options configure a Ledger. The zero value is valid.
type Options struct {
	// Prefix is the prefix of every key. Zero value: DefaultPrefix.
	Prefix string
	// Retention, when > 0, makes a record expire this long after its
	// finish (finished or failed), so the ledger does not grow for ever;
	// keep it longer than the period. A record that expired is forgotten:
	// its window could run again if it were still current. Zero value:
	// records are kept.
	Retention time.Duration
}

// Ledger is a once.Ledger in Redis. Safe for concurrent use.
type Ledger struct {
	c     Client
	o     Options
	owned *redis.Client // closed by Close (Open)
}

var _ once.Ledger = (*Ledger)(nil)

// New returns a Ledger on client (never closed by the Ledger). opts may be
// nil. A negative Retention is an error matching dlock.ErrInvalidArgument.
func New(client Client, opts *Options) (*Ledger, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if client == nil {
		return nil, fmt.Errorf("redisledger: nil client: %w", dlock.ErrInvalidArgument)
	}
	if o.Retention < 0 {
		return nil, fmt.Errorf("redisledger: negative Retention %v: %w", o.Retention, dlock.ErrInvalidArgument)
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	return &Ledger{c: client, o: o}, nil
}

// Open opens a Ledger on the Redis at rawURL ("redis://…" or "rediss://…",
// as go-redis's ParseURL reads it) and pings it. Close closes the client.
// A URL go-redis refuses is an error matching dlock.ErrInvalidArgument; a
// Redis that cannot be reached, dlock.ErrUnavailable.
func Open(ctx context.Context, rawURL string) (*Ledger, error) {
	ro, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redisledger: %w: %w", dlock.ErrInvalidArgument, err)
	}
	c := redis.NewClient(ro)
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redisledger: %s cannot be reached: %w: %w", ro.Addr, dlock.ErrUnavailable, err)
	}
	l, _ := New(c, nil)
	l.owned = c
	return l, nil
}

// Close closes the client when Open made it.
func (l *Ledger) Close() error {
	if l.owned != nil {
		return l.owned.Close()
	}
	return nil
}

// key returns the hash of (job, window). The job is in a hash tag, with
// its braces escaped so that a job cannot end the tag early.
func (l *Ledger) key(job, window string) string {
	esc := strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(job)
	return l.o.Prefix + "{" + esc + "}:" + window
}

// Now implements once.Ledger: the Redis server's clock.
func (l *Ledger) Now(ctx context.Context) (time.Time, error) {
	t, err := l.c.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("redisledger: now: %w", err)
	}
	return t.UTC(), nil
}

// Get implements once.Ledger.
func (l *Ledger) Get(ctx context.Context, job, window string) (once.Record, error) {
	m, err := l.c.HGetAll(ctx, l.key(job, window)).Result()
	if err != nil {
		return once.Record{}, fmt.Errorf("redisledger: get %q window %q: %w", job, window, err)
	}
	if len(m) == 0 {
		return once.Record{}, fmt.Errorf("redisledger: %q window %q: %w", job, window, once.ErrNoRecord)
	}
	r := once.Record{Job: job, Window: window, State: once.State(m["state"]), Owner: m["owner"], Node: m["node"], Error: m["error"]}
	r.Fence, _ = strconv.ParseUint(m["fence"], 10, 64)
	r.Attempt, _ = strconv.Atoi(m["attempt"])
	if us, _ := strconv.ParseInt(m["started_us"], 10, 64); us != 0 {
		r.StartedAt = time.UnixMicro(us).UTC()
	}
	if us, _ := strconv.ParseInt(m["finished_us"], 10, 64); us != 0 {
		r.FinishedAt = time.UnixMicro(us).UTC()
	}
	return r, nil
}

// gt is the Lua comparison of two decimal fences without leading zeros,
// exact above 2^53 (Lua numbers are doubles).
const gt = `local function gt(a, b) return #a > #b or (#a == #b and a > b) end
local function now() local t = redis.call('TIME') return t[1] .. string.format('%06d', tonumber(t[2])) end
`

// startScript: ARGV fence, owner, node. {1} started; {0, "finished"};
// {0, "stale", stored fence}.
var startScript = redis.NewScript(gt + `
local cur = redis.call('HMGET', KEYS[1], 'state', 'fence', 'attempt')
if cur[1] == 'finished' then return {0, 'finished'} end
if cur[2] and not gt(ARGV[1], cur[2]) then return {0, 'stale', cur[2]} end
local attempt = (tonumber(cur[3]) or 0) + 1
redis.call('PERSIST', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'started', 'fence', ARGV[1], 'owner', ARGV[2], 'node', ARGV[3],
	'attempt', attempt, 'started_us', now(), 'finished_us', '0', 'error', '')
return {1}
`)

// finishScript: ARGV fence, state, error, retention ms. 1 or 0 (refused).
var finishScript = redis.NewScript(gt + `
local cur = redis.call('HMGET', KEYS[1], 'state', 'fence')
if cur[1] ~= 'started' or cur[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'finished_us', now(), 'error', ARGV[3])
if ARGV[4] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return 1
`)

// Start implements once.Ledger (one script: the check and the write are
// atomic).
func (l *Ledger) Start(ctx context.Context, req once.StartRequest) (once.Record, error) {
	if req.Fence == 0 {
		return once.Record{}, fmt.Errorf("redisledger: start %q window %q: fence 0 is not a fence: %w", req.Job, req.Window, dlock.ErrInvalidArgument)
	}
	f := strconv.FormatUint(req.Fence, 10)
	res, err := startScript.Run(ctx, l.c, []string{l.key(req.Job, req.Window)}, f, req.Owner, req.Node).Slice()
	if err != nil {
		return once.Record{}, fmt.Errorf("redisledger: start %q window %q: %w", req.Job, req.Window, err)
	}
	r, gerr := l.Get(ctx, req.Job, req.Window)
	if ok, _ := res[0].(int64); ok == 1 {
		return r, gerr
	}
	if len(res) > 1 && res[1] == "finished" {
		return r, fmt.Errorf("redisledger: start %q window %q: %w", req.Job, req.Window, once.ErrFinished)
	}
	stored := "?"
	if len(res) > 2 {
		stored = fmt.Sprint(res[2])
	}
	return r, fmt.Errorf("redisledger: start %q window %q with fence %d: the ledger has fence %s: %w", req.Job, req.Window, req.Fence, stored, once.ErrStaleFence)
}

// Finish implements once.Ledger.
func (l *Ledger) Finish(ctx context.Context, job, window string, fence uint64, runErr string) (once.Record, error) {
	state := once.Finished
	if runErr != "" {
		state = once.Failed
	}
	ret := "0"
	if l.o.Retention > 0 {
		ret = strconv.FormatInt(max(l.o.Retention.Milliseconds(), 1), 10)
	}
	ok, err := finishScript.Run(ctx, l.c, []string{l.key(job, window)}, strconv.FormatUint(fence, 10), string(state), runErr, ret).Int()
	if err != nil {
		return once.Record{}, fmt.Errorf("redisledger: finish %q window %q: %w", job, window, err)
	}
	r, gerr := l.Get(ctx, job, window)
	if ok != 1 {
		what := "no record"
		if gerr == nil {
			what = fmt.Sprintf("a %s attempt with fence %d", r.State, r.Fence)
		}
		return r, fmt.Errorf("redisledger: finish %q window %q with fence %d: the ledger has %s: %w", job, window, fence, what, once.ErrStaleFence)
	}
	return r, gerr
}
