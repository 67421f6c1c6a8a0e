package verify

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dlock-dev/dlock/internal/netproxy"
)

// env is what a fault acts on.
type env struct {
	target  Target
	clients []*client
	ttl     time.Duration
	rng     *rand.Rand
	logf    func(format string, args ...any)
}

// fault is one nemesis: inject turns it on and returns what heals it.
type fault struct {
	name string
	doc  string
	// on is how long one injection lasts, in TTLs.
	on float64
	// once: inject a single time per run (a failover cannot be undone).
	once bool
	// needs reports whether the target can take the fault.
	needs func(Target) error
	// prepare runs at the start of each quiet period (a checkpoint the
	// next injection restores).
	prepare func(ctx context.Context, e *env) error
	inject  func(ctx context.Context, e *env) (heal func(context.Context) error, note string, err error)
}

// FaultInfo describes one fault for help texts and reports.
type FaultInfo struct {
	Name, Doc string
}

// Faults lists the faults Config.Faults may name, in the matrix's order.
func Faults() []FaultInfo {
	out := make([]FaultInfo, len(faults))
	for i, f := range faults {
		out[i] = FaultInfo{Name: f.name, Doc: f.doc}
	}
	return out
}

func lookupFault(name string) (*fault, error) {
	for i := range faults {
		if faults[i].name == name {
			return &faults[i], nil
		}
	}
	var names []string
	for _, f := range faults {
		names = append(names, f.name)
	}
	return nil, fmt.Errorf("verify: unknown fault %q (faults: %s)", name, strings.Join(names, ", "))
}

// Supports reports whether target can take every fault of the
// comma-separated list: nil, or an error matching ErrUnsupportedFault
// that says why.
func Supports(target Target, faultList string) error {
	for _, name := range splitFaults(faultList) {
		f, err := lookupFault(name)
		if err != nil {
			return err
		}
		if f.needs != nil {
			if err := f.needs(target); err != nil {
				return fmt.Errorf("%w: %s on %s: %v", ErrUnsupportedFault, name, target.Name(), err)
			}
		}
	}
	return nil
}

func splitFaults(list string) []string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" && s != "none" {
			out = append(out, s)
		}
	}
	return out
}

func needLinks(t Target) error {
	if l, ok := t.(Linked); ok && len(l.Links()) > 0 {
		return nil
	}
	return errors.New("its clients do not reach it through the verifier's proxies")
}

func needKiller(t Target) error {
	if _, ok := t.(Killer); ok {
		return nil
	}
	if _, ok := t.(Cluster); ok {
		return nil
	}
	return errors.New("the verifier did not start its process")
}

func needLeader(t Target) error {
	c, ok := t.(Cluster)
	if !ok {
		return errors.New("not a cluster the verifier started")
	}
	if _, err := c.Leader(context.Background()); errors.Is(err, errors.ErrUnsupported) {
		return errors.New("it has no leader")
	}
	return nil
}

func needPartitioner(t Target) error {
	_, c := t.(Cluster)
	if _, p := t.(Partitioner); c && p {
		return nil
	}
	return errors.New("the verifier does not own its members' links")
}

func needLeaderLinks(t Target) error {
	if err := needLeader(t); err != nil {
		return err
	}
	return needPartitioner(t)
}

// armVictims arms a client fault on every client for the next holds, at
// most half the clients' number of them (at least one), so that the
// clients that hold a key next take it.
func armVictims(e *env, kind string, amount func(n int) time.Duration) (func(context.Context) error, string) {
	n := int32(max(1, len(e.clients)/2))
	f := &clientFault{kind: kind, amount: amount, budget: new(atomic.Int32), total: n}
	f.budget.Store(n)
	for _, c := range e.clients {
		c.arm(f)
	}
	heal := func(context.Context) error {
		for _, c := range e.clients {
			c.arm(nil)
		}
		return nil
	}
	return heal, fmt.Sprintf("the next %d holds", n)
}

func links(t Target) []*netproxy.Proxy { return t.(Linked).Links() }

func leaderOf(ctx context.Context, e *env) (Cluster, int, error) {
	c := e.target.(Cluster)
	l, err := c.Leader(ctx)
	return c, l, err
}

var faults = []fault{
	{
		name: "pause", on: 4,
		doc: "holder pause past its TTL: a client checks its lease, stops for 1.5x or 3x the TTL with its heartbeats frozen (SIGSTOP, a GC pause), then writes without looking again",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			heal, note := armVictims(e, "pause", func(k int) time.Duration {
				if k%2 == 0 {
					return e.ttl * 3 / 2
				}
				return 3 * e.ttl
			})
			return heal, note, nil
		},
	},
	{
		name: "clock-jump", on: 4,
		doc: "a client's clock falls 2x the TTL behind: its heartbeats stop and it works until its own clock says the lease ended",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			heal, note := armVictims(e, "clock-jump", func(int) time.Duration { return 2 * e.ttl })
			return heal, note, nil
		},
	},
	{
		name: "store-clock-jump", on: 1,
		needs: func(t Target) error {
			if _, ok := t.(ClockJumper); ok {
				return nil
			}
			return errors.New("the verifier cannot move its clock")
		},
		doc: "dlockd only: the lease clock of its leader (of its one node) jumps 2x the TTL forward, so it ends every grant early, and hands the keys on as soon as it has told their holders",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			m, err := e.target.(ClockJumper).JumpClock(ctx, 2*e.ttl)
			return func(context.Context) error { return nil }, m, err
		},
	},
	{
		name: "blackhole", on: 2, needs: needLinks,
		doc: "client↔store links deliver nothing for 2x the TTL (then what was held arrives late, as TCP retransmits)",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			for _, p := range links(e.target) {
				p.Hold()
			}
			return func(context.Context) error {
				for _, p := range links(e.target) {
					p.Release()
				}
				return nil
			}, "", nil
		},
	},
	{
		name: "reply-loss", on: 1, needs: needLinks,
		doc: "requests reach the store but its replies are dropped for one TTL, then the connections are cut",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			for _, p := range links(e.target) {
				p.Drop(netproxy.Downstream, true)
			}
			return func(context.Context) error {
				for _, p := range links(e.target) {
					p.Drop(netproxy.Downstream, false)
					p.Cut()
				}
				return nil
			}, "", nil
		},
	},
	{
		name: "kill", on: 0.5, needs: needKiller,
		doc: "the store process (a random member of a cluster) is killed -9 and restarted on its data after half a TTL",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			if k, ok := e.target.(Killer); ok {
				if err := k.Kill(ctx); err != nil {
					return nil, "", err
				}
				return k.Restart, "", nil
			}
			c := e.target.(Cluster)
			i := e.rng.IntN(c.Members())
			if err := c.KillMember(ctx, i); err != nil {
				return nil, "", err
			}
			return func(ctx context.Context) error { return c.RestartMember(ctx, i) }, fmt.Sprintf("member %d", i), nil
		},
	},
	{
		name: "restart-lossy", on: 1,
		needs: func(t Target) error {
			if _, ok := t.(LossyRestarter); ok {
				return nil
			}
			return errors.New("no way to make it lose acknowledged writes")
		},
		doc: "the store is killed -9 and restarted on the durable state it had 2 TTLs earlier (Redis without AOF: on nothing), as after a lying fsync",
		prepare: func(ctx context.Context, e *env) error {
			return e.target.(LossyRestarter).Checkpoint(ctx)
		},
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			return func(context.Context) error { return nil }, "", e.target.(LossyRestarter).RestartFromCheckpoint(ctx)
		},
	},
	{
		name: "failover", on: 3, once: true,
		needs: func(t Target) error {
			if _, ok := t.(FailoverTarget); ok {
				return nil
			}
			return errors.New("no replica to promote")
		},
		doc: "the primary is killed -9 just after a grant (so that it is still in the replication lag) and its asynchronous replica promoted (REPLICAOF NO ONE); clients follow it",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			// The seed's warning needs a grant the replica has not seen:
			// wait (up to 2 TTLs) for the next one, then kill at once.
			note := "killed just after a grant"
			if len(e.clients) == 0 || !e.clients[0].rec.waitGrant(ctx, e.clients[0].rec.now(), 2*e.ttl) {
				note = "no grant within 2 TTLs: killed anyway"
			}
			return func(context.Context) error { return nil }, note, e.target.(FailoverTarget).Failover(ctx)
		},
	},
	{
		name: "partition", on: 3, needs: needPartitioner,
		doc: "the members are split into a random minority and majority for 3x the TTL",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			n, p := e.target.(Cluster).Members(), e.target.(Partitioner)
			perm := e.rng.Perm(n)
			k := 1 + e.rng.IntN(max(1, (n-1)/2))
			minority, majority := slices.Clone(perm[:k]), slices.Clone(perm[k:])
			slices.Sort(minority)
			slices.Sort(majority)
			if err := p.Partition(minority, majority); err != nil {
				return nil, "", err
			}
			return func(context.Context) error { return p.Heal() }, fmt.Sprintf("%v | %v", minority, majority), nil
		},
	},
	{
		name: "leader-isolate", on: 3, needs: needLeaderLinks,
		doc: "the leader is cut from every other member for 3x the TTL",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			_, l, err := leaderOf(ctx, e)
			if err != nil {
				return nil, "", err
			}
			p := e.target.(Partitioner)
			if err := p.Isolate(l); err != nil {
				return nil, "", err
			}
			return func(context.Context) error { return p.Heal() }, fmt.Sprintf("leader %d", l), nil
		},
	},
	{
		name: "leader-kill", on: 2, needs: needLeader,
		doc: "the leader is killed -9 and restarted on its data 2x the TTL later",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			c, l, err := leaderOf(ctx, e)
			if err != nil {
				return nil, "", err
			}
			if err := c.KillMember(ctx, l); err != nil {
				return nil, "", err
			}
			return func(ctx context.Context) error { return c.RestartMember(ctx, l) }, fmt.Sprintf("leader %d", l), nil
		},
	},
	{
		name: "leader-pause", on: 2, needs: needLeader,
		doc: "the leader is stopped (SIGSTOP) for 2x the TTL, then continued",
		inject: func(ctx context.Context, e *env) (func(context.Context) error, string, error) {
			c, l, err := leaderOf(ctx, e)
			if err != nil {
				return nil, "", err
			}
			if err := c.PauseMember(l); err != nil {
				return nil, "", err
			}
			return func(context.Context) error { return c.ResumeMember(l) }, fmt.Sprintf("leader %d", l), nil
		},
	},
}
