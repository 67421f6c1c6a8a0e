package zkdriver

import (
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

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
