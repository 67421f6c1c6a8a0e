package verify

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/dlock-dev/dlock/internal/netproxy"
)

// Target is a store under test as the verifier reaches it. A Target may
// implement the optional interfaces below; a fault that needs one the
// target lacks is refused before the run starts (ErrUnsupportedFault).
type Target interface {
	// Name is the store's short name for reports ("redis", "dlockd3").
	Name() string
	// URL is the store URL each client opens.
	URL() string
	// Close stops what the target started (proxies, servers).
	Close() error
}

// Linked is a Target whose client↔store connections pass through TCP
// proxies the verifier owns (for blackhole and reply-loss).
type Linked interface {
	Links() []*netproxy.Proxy
}

// Killer is a Target whose store process (one node of a cluster: any)
// the verifier can kill -9 and start again on the same data.
type Killer interface {
	Kill(ctx context.Context) error
	Restart(ctx context.Context) error
}

// LossyRestarter is a Target that can lose acknowledged writes: Checkpoint
// copies the store's durable state, and RestartFromCheckpoint kills the
// store -9 and starts it on that older state (Redis without AOF: on
// nothing), as a disk that lied about fsync would.
type LossyRestarter interface {
	Checkpoint(ctx context.Context) error
	RestartFromCheckpoint(ctx context.Context) error
}

// FailoverTarget is a primary with an asynchronous replica: Failover kills
// the primary -9, promotes the replica and points the clients' proxies at
// it, losing whatever had not yet been replicated.
type FailoverTarget interface {
	Failover(ctx context.Context) error
}

// Cluster is a Target of several members the verifier can fault one by one.
type Cluster interface {
	Members() int
	// Leader returns the current leader's index, or an error matching
	// errors.ErrUnsupported for a store without one (Redlock).
	Leader(ctx context.Context) (int, error)
	KillMember(ctx context.Context, i int) error
	RestartMember(ctx context.Context, i int) error
	PauseMember(i int) error
	ResumeMember(i int) error
}

// Partitioner is a Cluster whose member↔member links (or, for Redlock,
// whose client↔member links) pass through proxies the verifier owns:
// Partition cuts every link between members of different groups, Isolate
// cuts member i from all the others, Heal restores every link.
type Partitioner interface {
	Partition(groups ...[]int) error
	Isolate(i int) error
	Heal() error
}

// ClockJumper is a store whose lease clock the verifier can move (dlockd
// started with --test-clock-offset-file): JumpClock moves the clock of the
// member that ends leases (a cluster's leader; the only node of one)
// forward by d, for good, and returns which member it moved.
type ClockJumper interface {
	JumpClock(ctx context.Context, d time.Duration) (member string, err error)
}

// ErrUnsupportedFault is returned by Run for a fault its target cannot
// inject; it matches errors.ErrUnsupported.
var ErrUnsupportedFault = fmt.Errorf("verify: fault not supported by this store: %w", errors.ErrUnsupported)

// URLTarget is a store the verifier did not start, reached at a URL: each
// host:port of the URL's host list (h1:p1,h2:p2) is replaced by a proxy
// the verifier owns, so the link faults (blackhole, reply-loss) work on
// any store; the process faults do not.
type URLTarget struct {
	name    string
	url     string
	proxies []*netproxy.Proxy
}

// NewURLTarget puts proxies in front of every host of rawURL. A URL
// without a host (a file or an embedded store) gets none.
func NewURLTarget(rawURL string, seed uint64) (*URLTarget, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("verify: store URL %q: want scheme://host:port/…", rawURL)
	}
	t := &URLTarget{name: u.Scheme, url: rawURL}
	if u.Host == "" {
		return t, nil
	}
	var hosts []string
	for i, h := range strings.Split(u.Host, ",") {
		p, err := netproxy.New(h, seed+uint64(i))
		if err != nil {
			t.Close()
			return nil, err
		}
		t.proxies = append(t.proxies, p)
		hosts = append(hosts, p.Addr())
	}
	u.Host = strings.Join(hosts, ",")
	t.url = u.String()
	return t, nil
}

// Name implements Target.
func (t *URLTarget) Name() string { return t.name }

// URL implements Target: the store's URL through the proxies.
func (t *URLTarget) URL() string { return t.url }

// Links implements Linked.
func (t *URLTarget) Links() []*netproxy.Proxy { return t.proxies }

// Close stops the proxies.
func (t *URLTarget) Close() error {
	for _, p := range t.proxies {
		p.Close()
	}
	return nil
}
