package matrix

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server/servertest"
	"github.com/dlock-dev/dlock/verify"
	"github.com/redis/go-redis/v9"
)

// proxied puts a verifier-owned proxy in front of each address and
// returns the proxies and their addresses joined with commas.
func proxied(h *testservers.Harness, seed uint64, addrs ...string) ([]*netproxy.Proxy, string) {
	var ps []*netproxy.Proxy
	var hosts []string
	for i, a := range addrs {
		p, err := netproxy.New(a, seed+uint64(i))
		if err != nil {
			h.Fatalf("matrix: proxy for %s: %v", a, err)
		}
		h.Cleanup(func() { p.Close() })
		ps = append(ps, p)
		hosts = append(hosts, p.Addr())
	}
	return ps, strings.Join(hosts, ",")
}

// base is what every managed target shares.
type base struct {
	name, url string
	links     []*netproxy.Proxy
}

func (b *base) Name() string             { return b.name }
func (b *base) URL() string              { return b.url }
func (b *base) Links() []*netproxy.Proxy { return b.links }
func (b *base) Close() error             { return nil } // the harness stops everything
func (b *base) cutAll()                  { cutLinks(b.links) }

// restarted is a Restart's tail: start's error, after the clients' links
// are cut (connections to the dead process would hang on the proxy).
func (b *base) restarted(err error) error {
	b.cutAll()
	return err
}
func cutLinks(ps []*netproxy.Proxy) {
	for _, p := range ps {
		p.Cut()
	}
}
func errNoLeader() error    { return fmt.Errorf("no leader: %w", errors.ErrUnsupported) }
func sigkill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
func waitGone(pid int, limit time.Duration) {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(b), ") Z ") {
			return // a zombie: dead, its parent not yet told
		}
	}
}

// dlockdCluster is dlockd on n real processes (servertest.StartCluster),
// fsync on; its clients reach each member through the member's API proxy,
// and every Raft link runs through a proxy too. With one node it takes
// restart-lossy (Checkpoint, RestartFromCheckpoint: the node's --data
// directory rolled back); dlockdSet hides those methods from bigger
// clusters.
type dlockdCluster struct {
	base
	c     *servertest.Cluster
	lossy *lossyDir // node 0's data directory; nil when n > 1
}

func startDlockd(h *testservers.Harness, n int, seed uint64) *dlockdCluster {
	c := servertest.StartCluster(h, n, servertest.ClusterOptions{Sync: true, Seed: seed, LogLevel: "warn", TestClock: true})
	var links []*netproxy.Proxy
	for i := range n {
		links = append(links, c.Node(i).API)
	}
	name := "dlockd"
	if n > 1 {
		name = fmt.Sprintf("dlockd%d", n)
	}
	d := &dlockdCluster{base: base{name: name, url: c.URL(), links: links}, c: c}
	if n == 1 {
		d.lossy = newLossyDir(h, c.Node(0).DataDir)
	}
	return d
}

func (d *dlockdCluster) Members() int { return d.c.N() }
func (d *dlockdCluster) Leader(ctx context.Context) (int, error) {
	if d.c.N() == 1 {
		return 0, errNoLeader()
	}
	return d.c.Leader(ctx)
}
func (d *dlockdCluster) KillMember(_ context.Context, i int) error    { return d.c.Kill(i) }
func (d *dlockdCluster) RestartMember(_ context.Context, i int) error { return d.c.Restart(i) }
func (d *dlockdCluster) PauseMember(i int) error                      { return d.c.Pause(i) }
func (d *dlockdCluster) ResumeMember(i int) error                     { return d.c.Resume(i) }
func (d *dlockdCluster) cluster() *servertest.Cluster                 { return d.c }

// JumpClock moves the lease clock of the leader (of the one node) forward
// by dt: servertest.Cluster.JumpClock.
func (d *dlockdCluster) JumpClock(ctx context.Context, dt time.Duration) (string, error) {
	i := 0
	if d.c.N() > 1 {
		l, err := d.c.Leader(ctx)
		if err != nil {
			return "", err
		}
		i = l
	}
	total, err := d.c.JumpClock(i, dt)
	return fmt.Sprintf("member %d (offset now %v)", i, total), err
}

// Checkpoint copies the one node's data directory (its Raft log, stable
// store and snapshots) while the process is stopped: see lossyDir. It
// fails on a cluster of more than one node.
func (d *dlockdCluster) Checkpoint(context.Context) error {
	if d.lossy == nil {
		return errors.New("restart-lossy needs a one-node dlockd")
	}
	return d.lossy.checkpoint(d.c.Node(0).PID())
}

// RestartFromCheckpoint kills the node -9 (waiting until it is reaped),
// puts the checkpoint's copy in place of its data directory, and starts
// it again on it; the clients' links are cut, as the dead process's
// connections would hang on the proxy.
func (d *dlockdCluster) RestartFromCheckpoint(context.Context) error {
	if d.lossy == nil {
		return errors.New("restart-lossy needs a one-node dlockd")
	}
	if err := d.c.Kill(0); err != nil {
		return err
	}
	if err := d.lossy.restore(); err != nil {
		return err
	}
	err := d.c.Restart(0)
	d.cutAll()
	return err
}

// dlockdSet is the 3- or 5-node cluster, which can also be partitioned.
// It holds the cluster as a dlockdMembers, not a *dlockdCluster, so that
// it lacks Checkpoint and RestartFromCheckpoint: restart-lossy is n/a on
// it. Rolling back one member's disk while the others keep theirs is
// another experiment than one store's lying fsync (the member rejoins a
// majority that still has the writes it lost), and rolling back all of
// them at one instant is not what a lying disk does either.
type dlockdSet struct{ dlockdMembers }

// dlockdMembers is what dlockdSet takes from *dlockdCluster.
type dlockdMembers interface {
	verify.Target
	verify.Linked
	verify.Cluster
	verify.ClockJumper
	cluster() *servertest.Cluster
}

func (d dlockdSet) Partition(groups ...[]int) error { d.cluster().Partition(groups...); return nil }
func (d dlockdSet) Isolate(i int) error             { d.cluster().Isolate(i); return nil }
func (d dlockdSet) Heal() error                     { d.cluster().Heal(); return nil }

// redisTarget is one redis-server (AOF, appendfsync everysec) behind a
// proxy. Its lossy restart deletes the AOF first: Redis without
// persistence, or one whose unsynced second was lost.
type redisTarget struct {
	base
	r *testservers.Redis
}

func startRedis(h *testservers.Harness, seed uint64) *redisTarget {
	r := testservers.StartRedis(h)
	links, hosts := proxied(h, seed, r.Addr())
	return &redisTarget{base: base{name: "redis", url: "redis://" + hosts, links: links}, r: r}
}

func (t *redisTarget) Kill(context.Context) error { t.r.Kill(); return nil }
func (t *redisTarget) Restart(context.Context) error {
	return t.restarted(t.r.Start())
}
func (t *redisTarget) Checkpoint(context.Context) error { return nil }
func (t *redisTarget) RestartFromCheckpoint(ctx context.Context) error {
	t.r.Kill()
	if err := wipeRedisData(t.r.Dir()); err != nil {
		return err
	}
	return t.Restart(ctx)
}

// wipeRedisData removes what redis-server persisted in dir (AOF and RDB
// files), keeping its config and log.
func wipeRedisData(dir string) error {
	for _, pat := range []string{"appendonlydir", "*.aof", "*.rdb"} {
		m, _ := filepath.Glob(filepath.Join(dir, pat))
		for _, p := range m {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// redisFailover is a primary and asynchronous replicas, whose
// replication runs through proxies that delay it (replication lag); the
// clients' proxy points at the primary until Failover.
type redisFailover struct {
	base
	primary  *testservers.Redis
	replicas []*testservers.Redis
	repls    []*netproxy.Proxy // repls[i]: replica i's link to its primary
}

// startRedisFailover starts a primary and n replicas, each replicating
// through its own proxy delayed by lag/2 to lag. query, when not "", is
// the store URL's query (the redis driver's options). With query set it
// waits until a WAIT for every replica succeeds: a primary counts a
// replica's acknowledgements only from its first REPLCONF ACK, sent once a
// second, so the first grants of a wait_replicas store would fail.
func startRedisFailover(h *testservers.Harness, seed uint64, lag time.Duration, n int, name, query string) *redisFailover {
	p := testservers.StartRedis(h)
	t := &redisFailover{primary: p}
	for i := range n {
		r := testservers.StartRedisReplica(h, p)
		repl, err := netproxy.New(p.Addr(), seed+100+uint64(i))
		if err != nil {
			h.Fatalf("matrix: replication proxy: %v", err)
		}
		h.Cleanup(func() { repl.Close() })
		repl.SetDelay(netproxy.Downstream, lag/2, lag)
		host, port, _ := strings.Cut(repl.Addr(), ":")
		if _, err := r.Command("REPLICAOF", host, port); err != nil {
			h.Fatalf("matrix: REPLICAOF through the lag proxy: %v", err)
		}
		t.replicas = append(t.replicas, r)
		t.repls = append(t.repls, repl)
	}
	if query != "" {
		if err := waitReplicaAcks(p.Addr(), n, 20*time.Second); err != nil {
			h.Fatalf("matrix: %s: %v", name, err)
		}
		query = "?" + query
	}
	links, hosts := proxied(h, seed, p.Addr())
	t.base = base{name: name, url: "redis://" + hosts + query, links: links}
	return t
}

// waitReplicaAcks waits until a write on the primary at addr is
// acknowledged by n replicas (WAIT), for up to limit.
func waitReplicaAcks(addr string, n int, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	conn := c.Conn()
	defer conn.Close()
	var last error
	for ctx.Err() == nil {
		if last = conn.Set(ctx, "verify:replica-probe", "1", 0).Err(); last == nil {
			got, err := conn.Do(ctx, "WAIT", n, 500).Int()
			if err == nil && got >= n {
				return nil
			}
			last = fmt.Errorf("WAIT %d: %d acknowledged, %v", n, got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("replicas did not acknowledge within %v: %v", limit, last)
}

// Failover kills the primary and promotes the replica that has the most
// of its stream (the greatest replication offset, as Redis Sentinel
// picks), with REPLICAOF NO ONE; the other replicas follow the promoted
// one (their lag proxies now lead to it), and the clients' proxies too.
func (t *redisFailover) Failover(context.Context) error {
	t.primary.Kill()
	best, bestOff := 0, int64(-1)
	for i, r := range t.replicas {
		info, err := r.Command("INFO", "replication")
		if err != nil {
			continue
		}
		if off := infoInt(info, "slave_repl_offset"); off > bestOff {
			best, bestOff = i, off
		}
	}
	promoted := t.replicas[best]
	if _, err := promoted.Command("REPLICAOF", "NO", "ONE"); err != nil {
		return fmt.Errorf("promote replica %d: %w", best, err)
	}
	for i, repl := range t.repls {
		if i != best {
			repl.SetTarget(promoted.Addr())
			repl.Cut()
		}
	}
	for _, p := range t.links {
		p.SetTarget(promoted.Addr())
	}
	t.cutAll()
	return nil
}

// infoInt returns the integer field name of an INFO reply, or -1.
func infoInt(info, name string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}

// redlockTarget is Redlock on five redis-servers, each behind a proxy.
// Partition cuts the clients off the minority's nodes (Redlock's nodes
// do not talk to each other: the clients' links are all there is).
type redlockTarget struct {
	base
	rs []*testservers.Redis
}

func startRedlock(h *testservers.Harness, seed uint64) *redlockTarget {
	rs := testservers.StartRedisN(h, 5)
	var addrs []string
	for _, r := range rs {
		addrs = append(addrs, r.Addr())
	}
	links, hosts := proxied(h, seed, addrs...)
	return &redlockTarget{base: base{name: "redlock", url: "redlock://" + hosts, links: links}, rs: rs}
}

func (t *redlockTarget) Members() int                        { return len(t.rs) }
func (t *redlockTarget) Leader(context.Context) (int, error) { return -1, errNoLeader() }
func (t *redlockTarget) KillMember(_ context.Context, i int) error {
	t.rs[i].Kill()
	return nil
}
func (t *redlockTarget) RestartMember(_ context.Context, i int) error {
	err := t.rs[i].Start()
	t.links[i].Cut()
	return err
}
func (t *redlockTarget) PauseMember(i int) error {
	return syscall.Kill(t.rs[i].PID(), syscall.SIGSTOP)
}
func (t *redlockTarget) ResumeMember(i int) error {
	return syscall.Kill(t.rs[i].PID(), syscall.SIGCONT)
}
func (t *redlockTarget) Partition(groups ...[]int) error {
	if len(groups) > 0 {
		for _, i := range groups[0] {
			t.links[i].Hold()
		}
	}
	return nil
}
func (t *redlockTarget) Isolate(i int) error { t.links[i].Hold(); return nil }
func (t *redlockTarget) Heal() error {
	for _, p := range t.links {
		p.Release()
	}
	return nil
}

// Checkpoint and RestartFromCheckpoint restart node 0 with no data: the
// failure Redlock's analysis warns about (a node that forgets a lock
// after a crash unless it fsyncs every write, or waits a TTL to rejoin).
func (t *redlockTarget) Checkpoint(context.Context) error { return nil }
func (t *redlockTarget) RestartFromCheckpoint(ctx context.Context) error {
	t.rs[0].Kill()
	if err := wipeRedisData(t.rs[0].Dir()); err != nil {
		return err
	}
	return t.RestartMember(ctx, 0)
}

// etcdTarget is one etcd behind a proxy. Its lossy restart rolls its
// --data-dir (WAL, snapshots, the bbolt backend) back to the checkpoint.
// The data dir is on tmpfs (see testservers.StartEtcd), where fsync is
// free but kill -9 loses nothing: only the rollback loses writes.
type etcdTarget struct {
	base
	e     *testservers.Etcd
	lossy *lossyDir
}

func startEtcd(h *testservers.Harness, seed uint64) *etcdTarget {
	e := testservers.StartEtcd(h)
	links, hosts := proxied(h, seed, e.Addr())
	return &etcdTarget{base: base{name: "etcd", url: "etcd://" + hosts, links: links}, e: e, lossy: newLossyDir(h, e.DataDir())}
}

func (t *etcdTarget) Kill(context.Context) error {
	pid := t.e.PID()
	if err := sigkill(pid); err != nil {
		return err
	}
	waitGone(pid, 10*time.Second)
	t.e.Stop()
	return nil
}
func (t *etcdTarget) Restart(context.Context) error {
	return t.restarted(t.e.Start())
}

// Checkpoint copies etcd's data dir while the process is stopped (see
// lossyDir).
func (t *etcdTarget) Checkpoint(context.Context) error { return t.lossy.checkpoint(t.e.PID()) }

// RestartFromCheckpoint kills etcd -9, waits until it is gone, puts the
// checkpoint in place of its data dir, starts it on it and cuts the
// clients' links.
func (t *etcdTarget) RestartFromCheckpoint(ctx context.Context) error {
	if err := t.Kill(ctx); err != nil {
		return err
	}
	if err := t.lossy.restore(); err != nil {
		return err
	}
	return t.Restart(ctx)
}

// etcdCluster is a 3-member etcd cluster whose member-to-member links
// run through peer gates (testservers.EtcdClusterOptions.Gated): each
// member advertises its gate as its peer URL, and the gate closes the
// connections of members cut from it, so the cluster takes partitions and
// the leader's isolation besides the leader's kill and pause. Clients
// reach each member through a proxy.
type etcdCluster struct {
	base
	c *testservers.EtcdCluster
}

func startEtcdCluster(h *testservers.Harness, seed uint64) *etcdCluster {
	c := testservers.StartEtcdClusterWith(h, 3, testservers.EtcdClusterOptions{Gated: true})
	var addrs []string
	for i := range c.Len() {
		addrs = append(addrs, c.Addr(i))
	}
	links, hosts := proxied(h, seed, addrs...)
	return &etcdCluster{base: base{name: "etcd3", url: "etcd://" + hosts, links: links}, c: c}
}

func (t *etcdCluster) Members() int { return t.c.Len() }
func (t *etcdCluster) Leader(ctx context.Context) (int, error) {
	for ctx.Err() == nil {
		if l := t.c.Leader(); l >= 0 {
			return l, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return -1, ctx.Err()
}
func (t *etcdCluster) KillMember(_ context.Context, i int) error { t.c.Kill(i); return nil }
func (t *etcdCluster) RestartMember(_ context.Context, i int) error {
	err := t.c.Restart(i)
	t.links[i].Cut()
	return err
}
func (t *etcdCluster) PauseMember(i int) error  { return syscall.Kill(t.c.PID(i), syscall.SIGSTOP) }
func (t *etcdCluster) ResumeMember(i int) error { return syscall.Kill(t.c.PID(i), syscall.SIGCONT) }

// Partition cuts every link between members of different groups at their
// gates (open connections closed, new ones refused); a member in no group
// is cut from everyone. The clients' links stay up.
func (t *etcdCluster) Partition(groups ...[]int) error { t.c.Partition(groups...); return nil }

// Isolate cuts member i from the others.
func (t *etcdCluster) Isolate(i int) error { t.c.Isolate(i); return nil }

// Heal restores every member-to-member link.
func (t *etcdCluster) Heal() error { t.c.Heal(); return nil }

// zkTarget is one ZooKeeper behind a proxy. Its lossy restart rolls its
// dataDir (snapshots and transaction log) back to the checkpoint. The test
// server runs with forceSync=no (see testservers.StartZooKeeper): it
// acknowledges writes it has not fsynced, so on this server the rollback is
// not only a lying disk's loss but what any power cut could do; under
// kill -9 alone it loses nothing (the page cache survives the process).
//
// What the rolled-back server does: it refuses every client whose last
// seen zxid is ahead of its own ("Refusing session request ... as it has
// seen zxid", CLIENT_ZXID_AHEAD), until writes of other clients carry its
// zxid past it; a new client is served, and gets the lost zxids again as
// fences. The verifier's clients all saw the lost zxids, so a run sees the
// store refuse them to its end (no grant after the first restart), not
// the reused fences.
type zkTarget struct {
	base
	z     *testservers.ZooKeeper
	lossy *lossyDir
}

func startZooKeeper(h *testservers.Harness, seed uint64) *zkTarget {
	z := testservers.StartZooKeeper(h)
	links, hosts := proxied(h, seed, z.Addr())
	return &zkTarget{base: base{name: "zookeeper", url: "zk://" + hosts + "/dlock", links: links}, z: z, lossy: newLossyDir(h, z.DataDir())}
}

func (t *zkTarget) Kill(context.Context) error {
	pid := t.z.PID()
	if err := sigkill(pid); err != nil {
		return err
	}
	waitGone(pid, 10*time.Second)
	t.z.Stop()
	return nil
}
func (t *zkTarget) Restart(context.Context) error {
	return t.restarted(t.z.Start())
}

// Checkpoint copies ZooKeeper's dataDir while the JVM is stopped (see
// lossyDir).
func (t *zkTarget) Checkpoint(context.Context) error { return t.lossy.checkpoint(t.z.PID()) }

// RestartFromCheckpoint kills ZooKeeper -9, waits until it is gone, puts
// the checkpoint in place of its dataDir, starts it on it and cuts the
// clients' links.
func (t *zkTarget) RestartFromCheckpoint(ctx context.Context) error {
	if err := t.Kill(ctx); err != nil {
		return err
	}
	if err := t.lossy.restore(); err != nil {
		return err
	}
	return t.Restart(ctx)
}

// pgTarget is one PostgreSQL behind a proxy.
type pgTarget struct {
	base
	p *testservers.Postgres
}

func startPostgres(h *testservers.Harness, seed uint64) *pgTarget {
	p := testservers.StartPostgres(h)
	links, hosts := proxied(h, seed, p.Addr())
	u := strings.Replace(p.URL(), p.Addr(), hosts, 1)
	return &pgTarget{base: base{name: "postgres", url: u, links: links}, p: p}
}

func (t *pgTarget) Kill(context.Context) error { t.p.Kill(); return nil }
func (t *pgTarget) Restart(context.Context) error {
	return t.restarted(t.p.Start())
}

var (
	_ verify.Cluster        = (*dlockdCluster)(nil)
	_ verify.LossyRestarter = (*dlockdCluster)(nil)
	_ verify.ClockJumper    = (*dlockdCluster)(nil)
	_ verify.Partitioner    = dlockdSet{}
	_ verify.Killer         = (*redisTarget)(nil)
	_ verify.LossyRestarter = (*redisTarget)(nil)
	_ verify.FailoverTarget = (*redisFailover)(nil)
	_ verify.Partitioner    = (*redlockTarget)(nil)
	_ verify.LossyRestarter = (*redlockTarget)(nil)
	_ verify.Cluster        = (*etcdCluster)(nil)
	_ verify.Partitioner    = (*etcdCluster)(nil)
	_ verify.Killer         = (*etcdTarget)(nil)
	_ verify.LossyRestarter = (*etcdTarget)(nil)
	_ verify.Killer         = (*zkTarget)(nil)
	_ verify.LossyRestarter = (*zkTarget)(nil)
	_ verify.Killer         = (*pgTarget)(nil)
	_ verify.Linked         = (*base)(nil)
)
