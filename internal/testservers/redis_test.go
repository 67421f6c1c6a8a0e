package testservers

import (
	"strings"
	"testing"
	"time"
)

// TestRedisReplica_FollowsAndPromotes: a write on the primary reaches the
// replica, which refuses writes until REPLICAOF NO ONE promotes it.
func TestRedisReplica_FollowsAndPromotes(t *testing.T) {
	primary := StartRedis(t)
	replica := StartRedisReplica(t, primary)
	if replica.Port() == primary.Port() {
		t.Fatal("replica on the primary's port")
	}
	info, err := replica.Command("INFO", "replication")
	if err != nil || !strings.Contains(info, "role:slave") {
		t.Fatalf("replica INFO replication: %v\n%s", err, info)
	}

	if got, err := primary.Command("SET", "k", "v1"); err != nil || got != "OK" {
		t.Fatalf("SET on primary = %q, %v", got, err)
	}
	waitRedisValue(t, replica.Addr(), "k", "v1")

	if _, err := RedisCommand(replica.Addr(), "SET", "k", "on-replica"); err == nil || !strings.Contains(err.Error(), "READONLY") {
		t.Fatalf("SET on the replica: %v, want READONLY", err)
	}

	if got, err := replica.Command("REPLICAOF", "NO", "ONE"); err != nil || got != "OK" {
		t.Fatalf("REPLICAOF NO ONE = %q, %v", got, err)
	}
	if got, err := replica.Command("SET", "k", "v2"); err != nil || got != "OK" {
		t.Fatalf("SET on the promoted replica = %q, %v", got, err)
	}
	if got, err := replica.Command("GET", "k"); err != nil || got != "v2" {
		t.Fatalf("GET on the promoted replica = %q, %v", got, err)
	}
	if got, err := primary.Command("GET", "k"); err != nil || got != "v1" {
		t.Fatalf("GET on the old primary = %q, %v, want v1 (no longer replicated)", got, err)
	}
}

// waitRedisValue waits up to 10 s until GET key on addr returns want.
func waitRedisValue(t *testing.T, addr, key, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := RedisCommand(addr, "GET", key)
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s on %s = %q, %v; want %q", key, addr, got, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
