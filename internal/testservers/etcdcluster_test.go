package testservers

import (
	"net"
	"testing"
	"time"
)

func TestEtcdCluster_LeaderKillRestart(t *testing.T) {
	c := StartEtcdCluster(t, 3)
	if c.Len() != 3 || c.URL() == "" {
		t.Fatalf("cluster %d members, URL %q", c.Len(), c.URL())
	}
	leader := waitEtcdLeader(t, c, -1)
	c.Kill(leader)
	if c.PID(leader) != 0 {
		t.Fatal("killed member still has a PID")
	}
	if next := waitEtcdLeader(t, c, leader); next == leader {
		t.Fatalf("the killed member %d is still the leader", leader)
	}
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	if c.PID(leader) == 0 {
		t.Fatal("restarted member has no PID")
	}
}

// waitEtcdLeader waits up to 20 s for a leader other than not.
func waitEtcdLeader(t *testing.T, c *EtcdCluster, not int) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if i := c.Leader(); i >= 0 && i != not {
			return i
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no etcd leader within 20 s")
	return -1
}

// TestEtcdCluster_StartsAgainWhenAPortWasTaken: a member that cannot listen
// (its port taken between FreePort and etcd's start) exits at startup; the
// cluster is then started again on fresh ports, and serves.
func TestEtcdCluster_StartsAgainWhenAPortWasTaken(t *testing.T) {
	attempts := 0
	var taken net.Listener
	beforeEtcdClusterStart = func(c *EtcdCluster) {
		attempts++
		if attempts == 1 {
			ln, err := net.Listen("tcp", c.Addr(2))
			if err != nil {
				t.Fatalf("take member 3's client port: %v", err)
			}
			taken = ln
		}
	}
	defer func() { beforeEtcdClusterStart = nil }()
	c := StartEtcdCluster(t, 3)
	if taken != nil {
		taken.Close()
	}
	if attempts != 2 {
		t.Fatalf("%d attempts, want 2 (the first one's member 3 could not listen)", attempts)
	}
	for i := range c.Len() {
		if c.Addr(i) == "" || c.PID(i) == 0 {
			t.Fatalf("member %d: addr %q, PID %d", i+1, c.Addr(i), c.PID(i))
		}
	}
	waitEtcdLeader(t, c, -1)
}
