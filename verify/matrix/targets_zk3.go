package matrix

import (
	"context"
	"syscall"
	"time"

	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/verify"
)

// zkEnsemble is a 3-member ZooKeeper ensemble whose every member-to-member
// link (quorum and election ports, each direction) runs through a proxy
// the verifier owns: each member's own config names the proxies it dials,
// so a partition cuts exactly the links between the two sides. Clients
// reach each member through a proxy too.
type zkEnsemble struct {
	base
	e *testservers.ZooKeeperEnsemble
	// peers[[2]int{from, to}] are the proxies member from dials to reach
	// member to (quorum and election).
	peers map[[2]int][]*netproxy.Proxy
}

func startZooKeeperEnsemble(h *testservers.Harness, seed uint64) *zkEnsemble {
	t := &zkEnsemble{peers: map[[2]int][]*netproxy.Proxy{}}
	n := 0
	e := testservers.StartZooKeeperEnsemble(h, 3, testservers.ZooKeeperEnsembleOptions{
		Peer: func(from, to int, addr string) string {
			n++
			p, err := netproxy.New(addr, seed+1000+uint64(n))
			if err != nil {
				h.Fatalf("matrix: peer proxy %d→%d: %v", from, to, err)
			}
			h.Cleanup(func() { p.Close() })
			k := [2]int{from, to}
			t.peers[k] = append(t.peers[k], p)
			return p.Addr()
		},
	})
	var addrs []string
	for i := range e.Len() {
		addrs = append(addrs, e.Addr(i))
	}
	links, hosts := proxied(h, seed, addrs...)
	t.base = base{name: "zookeeper3", url: "zk://" + hosts + "/dlock", links: links}
	t.e = e
	return t
}

func (t *zkEnsemble) Members() int { return t.e.Len() }

// Leader polls the members' srvr answers until one says it leads.
func (t *zkEnsemble) Leader(ctx context.Context) (int, error) {
	for ctx.Err() == nil {
		if l := t.e.Leader(); l >= 0 {
			return l, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return -1, ctx.Err()
}

func (t *zkEnsemble) KillMember(_ context.Context, i int) error { t.e.Kill(i); return nil }

// RestartMember starts member i again on its data, and cuts the clients'
// connections to it (those to the dead process would hang on the proxy).
// It does not wait for the member to rejoin: while a partition or a dead
// peer keeps it from a quorum it cannot serve.
func (t *zkEnsemble) RestartMember(_ context.Context, i int) error {
	err := t.e.Start(i)
	t.links[i].Cut()
	return err
}
func (t *zkEnsemble) PauseMember(i int) error  { return syscall.Kill(t.e.PID(i), syscall.SIGSTOP) }
func (t *zkEnsemble) ResumeMember(i int) error { return syscall.Kill(t.e.PID(i), syscall.SIGCONT) }

// Partition cuts every link between members of different groups (bytes
// in flight are dropped, as a partition loses packets); members in no
// group are cut from everyone.
func (t *zkEnsemble) Partition(groups ...[]int) error {
	group := make([]int, t.e.Len())
	for i := range group {
		group[i] = -1 - i
	}
	for g, ms := range groups {
		for _, i := range ms {
			group[i] = g
		}
	}
	for k, ps := range t.peers {
		if group[k[0]] == group[k[1]] {
			continue
		}
		for _, p := range ps {
			p.Hold()
			p.Cut()
		}
	}
	return nil
}

// Isolate cuts member i from the others.
func (t *zkEnsemble) Isolate(i int) error {
	var rest []int
	for j := range t.e.Len() {
		if j != i {
			rest = append(rest, j)
		}
	}
	return t.Partition([]int{i}, rest)
}

// Heal restores every member-to-member link, dropping what was held.
func (t *zkEnsemble) Heal() error {
	for _, ps := range t.peers {
		for _, p := range ps {
			p.Cut()
			p.Release()
		}
	}
	return nil
}

var (
	_ verify.Cluster     = (*zkEnsemble)(nil)
	_ verify.Partitioner = (*zkEnsemble)(nil)
)
