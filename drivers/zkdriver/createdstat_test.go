package zkdriver

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestOnlyChildFence_IsTheNodesCzxid: against a real ZooKeeper, the fence
// onlyChildFence derives from the parent's listing right after a
// sequential create is the node's czxid when nothing else changed the
// key's children, and it declines when another child exists.
func TestOnlyChildFence_IsTheNodesCzxid(t *testing.T) {
	z := testservers.StartZooKeeper(t)
	conn, _, err := zk.Connect([]string{z.Addr()}, 5*time.Second, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	acl := zk.WorldACL(zk.PermAll)
	if _, err := conn.CreateContainer("/cs", nil, zk.FlagContainer, acl); err != nil {
		t.Fatal(err)
	}
	var prev int64
	for range 5 { // create, list, delete: each fence the node's czxid, increasing
		p, err := conn.Create("/cs/owner-", nil, zk.FlagEphemeralSequential, acl)
		if err != nil {
			t.Fatal(err)
		}
		children, parent, err := conn.Children("/cs")
		if err != nil {
			t.Fatal(err)
		}
		_, real, err := conn.Exists(p)
		if err != nil {
			t.Fatal(err)
		}
		fence, ok := onlyChildFence(p[len("/cs/"):], children, parent)
		if !ok || fence != real.Czxid || fence <= prev {
			t.Fatalf("onlyChildFence(%s) = %x, %v; the node's czxid is %x, the last fence %x", p, fence, ok, real.Czxid, prev)
		}
		prev = fence
		if err := conn.Delete(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	p, err := conn.Create("/cs/owner-", nil, zk.FlagEphemeralSequential, acl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Create("/cs/other-", nil, zk.FlagEphemeralSequential, acl); err != nil {
		t.Fatal(err)
	}
	children, parent, err := conn.Children("/cs")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := onlyChildFence(p[len("/cs/"):], children, parent); ok {
		t.Fatalf("onlyChildFence accepted a node that is not the only child: %v", children)
	}
}

// TestCreateNode_ParentStatInTheSameTransaction: createNode's multi
// answers, against a real ZooKeeper, with the key node's stat as its own
// create left it: one child and a pzxid equal to the new node's czxid for a
// free key, two children for a held one; a missing key node fails it with
// zk.ErrNoNode (enqueueAs then creates the container); and a free key
// acquired through TryAcquire takes that czxid as its fence, as Inspect
// reports it.
func TestCreateNode_ParentStatInTheSameTransaction(t *testing.T) {
	z := testservers.StartZooKeeper(t)
	u, err := url.Parse(z.URL() + "?op_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(t.Context(), u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dir := d.dir("cn")
	if _, err := d.createNode(dir, "owner-a", nil); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("createNode without the key's node = %v, want zk.ErrNoNode", err)
	}
	if _, err := d.conn.CreateContainer(dir, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	first, err := d.createNode(dir, "owner-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, st, err := d.conn.Exists(first.path)
	if err != nil {
		t.Fatal(err)
	}
	if first.parent == nil || first.parent.NumChildren != 1 || first.parent.Pzxid != st.Czxid {
		t.Fatalf("free key: parent stat %+v; want 1 child and pzxid = the node's czxid %x", first.parent, st.Czxid)
	}
	second, err := d.createNode(dir, "owner-b", nil)
	if err != nil {
		t.Fatal(err)
	}
	if second.parent == nil || second.parent.NumChildren != 2 {
		t.Fatalf("held key: parent stat %+v; want 2 children", second.parent)
	}
	for _, c := range []created{first, second} {
		if err := d.conn.Delete(c.path, -1); err != nil {
			t.Fatal(err)
		}
	}

	g, err := d.TryAcquire(t.Context(), driver.AcquireRequest{Key: "cn", Owner: "owner-cccccccc", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	info, err := d.Inspect(t.Context(), "cn")
	if err != nil || info.Fence != g.Fence || g.Fence <= uint64(st.Czxid) {
		t.Fatalf("TryAcquire fence %d, Inspect %+v, %v; want Inspect's czxid, above %d", g.Fence, info, err, st.Czxid)
	}
	if err := d.Release(t.Context(), "cn", "owner-cccccccc"); err != nil {
		t.Fatal(err)
	}
}
