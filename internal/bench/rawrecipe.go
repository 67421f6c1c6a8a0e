package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The raw recipe baselines are W1 written with each store's official
// client alone, no dlock code: the lightest correct lock round trip the
// store allows, each client its own connection (its own session). They
// are what the dlock etcd and ZooKeeper drivers are read against
// ("× raw recipe" in W1), as raw Redis is for the Redis drivers.
//
//   - RawEtcdUncontended: one etcd lease per client (TTL 30 s, kept by no
//     keepalive: a cell is shorter), granted before the loop, as
//     etcd's concurrency.Session shares one lease between its mutexes;
//     each cycle is Txn(If CreateRevision(key) == 0).Then(Put(key, token,
//     lease)) for the grant (its fence: the create revision) and
//     Txn(If CreateRevision(key) == fence).Then(Delete(key)) for the
//     release: two writes per cycle. Neither renewal nor waiting.
//   - RawZKUncontended: one ZooKeeper session per client; each cycle
//     creates an ephemeral node at the key's path (a second create fails
//     with NodeExists: the grant) and deletes it with the version it was
//     created with (the release): two writes per cycle. Neither fence nor
//     renewal nor waiting (the lock recipe's sequential node and
//     GetChildren are what waiting needs).

// errRawRefused is a raw grant that found an own key held (W1's keys are
// never held by another client: an error).
var errRawRefused = errors.New("bench: raw recipe: an own key was held")

// rawEtcdPrefix is the key prefix of one raw etcd cell.
func rawEtcdPrefix(n int) string { return fmt.Sprintf("/dlock-bench-raw/%s/%d/", runID, n) }

// RawEtcdUncontended runs W1 with the official etcd client alone against
// the etcd endpoint (host:port; several separated by commas): n clients,
// each its own connection and lease and its own key, grant and release
// transactions in a loop for d (see the raw recipe baselines above). The
// cell's keys are deleted and the leases revoked at the end. Store is
// "raw-etcd".
func RawEtcdUncontended(ctx context.Context, endpoint string, n int, d time.Duration) (Uncontended, error) {
	cs := make([]*clientv3.Client, 0, n)
	leases := make([]clientv3.LeaseID, 0, n)
	closeAll := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		for i, c := range cs {
			if i < len(leases) {
				_, _ = c.Revoke(cctx, leases[i])
			}
			if i == 0 {
				_, _ = c.Delete(cctx, rawEtcdPrefix(n), clientv3.WithPrefix())
			}
			_ = c.Close()
		}
	}
	defer closeAll()
	for range n {
		c, err := clientv3.New(clientv3.Config{
			Endpoints: strings.Split(endpoint, ","), DialTimeout: 5 * time.Second,
			Logger: zap.NewNop(), Context: context.WithoutCancel(ctx),
		})
		if err != nil {
			return Uncontended{}, fmt.Errorf("bench: raw etcd at %s: %w", endpoint, err)
		}
		cs = append(cs, c)
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lg, err := c.Grant(gctx, 30)
		cancel()
		if err != nil {
			return Uncontended{}, fmt.Errorf("bench: raw etcd at %s: lease grant: %w", endpoint, err)
		}
		leases = append(leases, lg.ID)
	}
	keys, toks := make([]string, n), make([]string, n)
	for i := range keys {
		keys[i], toks[i] = fmt.Sprintf("%s%d", rawEtcdPrefix(n), i), token()
	}
	return cycles(ctx, "raw-etcd", n, d, func(i int) (time.Duration, error) {
		t0 := time.Now()
		k := keys[i]
		resp, err := cs[i].Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, toks[i], clientv3.WithLease(leases[i]))).
			Commit()
		if err == nil && !resp.Succeeded {
			err = errRawRefused
		}
		if err != nil {
			return 0, err
		}
		took := time.Since(t0)
		fence := resp.Header.Revision // the put's revision: the entry's create revision
		rel, err := cs[i].Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", fence)).
			Then(clientv3.OpDelete(k)).
			Commit()
		if err == nil && !rel.Succeeded {
			err = fmt.Errorf("bench: raw etcd: release of %s found another grant", k)
		}
		return took, err
	}), ctx.Err()
}

// RawZKUncontended runs W1 with go-zookeeper/zk alone against the
// ZooKeeper server at addr (host:port; several separated by commas): n
// clients, each its own session and its own key, an ephemeral create and
// a versioned delete in a loop for d (see the raw recipe baselines above),
// under a parent node that is deleted at the end. Store is "raw-zk".
func RawZKUncontended(ctx context.Context, addr string, n int, d time.Duration) (Uncontended, error) {
	cs := make([]*zk.Conn, 0, n)
	parent := fmt.Sprintf("/dlock-bench-raw-%s-%d", runID, n)
	closeAll := func() {
		if len(cs) > 0 {
			for i := range n {
				_ = cs[0].Delete(fmt.Sprintf("%s/%d", parent, i), -1)
			}
			_ = cs[0].Delete(parent, -1)
		}
		for _, c := range cs {
			c.Close()
		}
	}
	defer closeAll()
	for range n {
		c, ev, err := zk.Connect(strings.Split(addr, ","), 10*time.Second, zk.WithLogInfo(false), zk.WithLogger(zkNoLog{}))
		if err != nil {
			return Uncontended{}, fmt.Errorf("bench: raw ZooKeeper at %s: %w", addr, err)
		}
		cs = append(cs, c)
		if err := zkConnected(ctx, ev, 10*time.Second); err != nil {
			return Uncontended{}, fmt.Errorf("bench: raw ZooKeeper at %s: %w", addr, err)
		}
	}
	if _, err := cs[0].Create(parent, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return Uncontended{}, fmt.Errorf("bench: raw ZooKeeper: create %s: %w", parent, err)
	}
	paths := make([]string, n)
	for i := range paths {
		paths[i] = fmt.Sprintf("%s/%d", parent, i)
	}
	acl := zk.WorldACL(zk.PermAll)
	return cycles(ctx, "raw-zk", n, d, func(i int) (time.Duration, error) {
		t0 := time.Now()
		_, err := cs[i].Create(paths[i], nil, zk.FlagEphemeral, acl)
		if errors.Is(err, zk.ErrNodeExists) {
			err = errRawRefused
		}
		if err != nil {
			return 0, err
		}
		took := time.Since(t0)
		return took, cs[i].Delete(paths[i], 0) // version 0: the node as created
	}), ctx.Err()
}

// zkConnected waits for the session to be established.
func zkConnected(ctx context.Context, ev <-chan zk.Event, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case e, ok := <-ev:
			if !ok {
				return errors.New("session events closed")
			}
			if e.State == zk.StateHasSession {
				return nil
			}
			if e.State == zk.StateAuthFailed || e.State == zk.StateExpired {
				return fmt.Errorf("session state %v", e.State)
			}
		case <-t.C:
			return fmt.Errorf("no session within %v", timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// zkNoLog drops go-zookeeper's log lines.
type zkNoLog struct{}

func (zkNoLog) Printf(string, ...any) {}
