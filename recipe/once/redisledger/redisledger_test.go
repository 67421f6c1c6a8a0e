package redisledger_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/redisdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/recipe/once"
	"github.com/dlock-dev/dlock/recipe/once/internal/oncetest"
	"github.com/dlock-dev/dlock/recipe/once/redisledger"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, url string) *redisledger.Ledger {
	t.Helper()
	l, err := redisledger.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestLedger_Rules(t *testing.T) {
	oncetest.LedgerRules(t, open(t, testservers.StartRedis(t).URL()))
}

func TestLedger_Retention(t *testing.T) {
	srv := testservers.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	l, err := redisledger.New(c, &redisledger.Options{Prefix: "p:", Retention: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := l.Start(ctx, once.StartRequest{Job: "j", Window: "w", Fence: 1}); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, "p:{j}:w").Val(); ttl != -1 {
		t.Fatalf("a started record expires (PTTL %v)", ttl)
	}
	if _, err := l.Finish(ctx, "j", "w", 1, ""); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, "p:{j}:w").Val(); ttl <= 0 || ttl > 300*time.Millisecond {
		t.Fatalf("PTTL of a finished record %v, want the retention", ttl)
	}
	if _, err := redisledger.New(c, &redisledger.Options{Retention: -1}); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("negative retention: %v", err)
	}
	if _, err := redisledger.Open(ctx, "redis://127.0.0.1:1"); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Open of a closed port: %v", err)
	}
	if _, err := redisledger.Open(ctx, "http://x"); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Open of a bad URL: %v", err)
	}
}

// TestRun_EightSkewedNodesOncePerWindow: the lock and the ledger both in
// Redis, each node with its own client of each.
func TestRun_EightSkewedNodesOncePerWindow(t *testing.T) {
	srv := testservers.StartRedis(t)
	oncetest.EightNodes(t, func(t *testing.T, i int) oncetest.Node {
		d, err := redisdriver.Open(t.Context(), srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		fd := dlocktest.NewFaultDriver(d, t.Logf)
		l := dlock.New(fd, dlock.WithStoreName("redis"), dlock.WithBackoff(5*time.Millisecond, 100*time.Millisecond))
		t.Cleanup(func() { _ = l.Close() })
		return oncetest.Node{Locker: l, Faults: dlocktest.Faults(fd), Ledger: open(t, srv.URL())}
	})
}
