package servertest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/server/servertest"
)

// TestMain removes the dlockd binary the tests built, and fails when a
// test left a goroutine behind (a proxy, a process waiter).
func TestMain(m *testing.M) {
	code := m.Run()
	servertest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// alive reports whether a process with pid exists (not reaped).
func alive(pid int) bool {
	return pid != 0 && !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func healthy(t *testing.T, c *servertest.Cluster, i int, within time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	_, code, err := c.Do(ctx, i, http.MethodGet, "/healthz", nil)
	return err == nil && code == http.StatusOK
}

// TestCluster_Faults drives the kit's faults on a 3-node cluster and checks
// each one's effect: an isolated leader is replaced, a healed one rejoins,
// a paused node answers nothing until resumed, a killed leader is reaped
// and replaced, and a restarted node serves again on its ports.
func TestCluster_Faults(t *testing.T) {
	var pids []int
	t.Run("cluster", func(t *testing.T) {
		c := servertest.StartCluster(t, 3, servertest.ClusterOptions{})
		if got := c.URL(); strings.Count(got, ",") != 2 || !strings.HasPrefix(got, "dlockd://") {
			t.Fatalf("URL() = %q, want dlockd:// with 3 members", got)
		}
		for i := 0; i < c.N(); i++ {
			pids = append(pids, c.Node(i).PID())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		l, err := c.WaitLeader(ctx)
		if err != nil {
			t.Fatal(err)
		}

		// Isolation: the majority elects another leader.
		c.Isolate(l)
		if !c.Partitioned(l, (l+1)%3) {
			t.Fatalf("Partitioned(%d, %d) = false after Isolate", l, (l+1)%3)
		}
		start := time.Now()
		l2, err := c.WaitLeader(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("isolated %s: %s elected in %v", c.Node(l).ID, c.Node(l2).ID, time.Since(start).Round(time.Millisecond))
		c.Heal()
		// Healed, the old leader follows the new term: one leader again,
		// and it serves writes.
		if _, err := c.WaitLeader(ctx); err != nil {
			t.Fatal(err)
		}

		// Pause: no answer while stopped, answers after SIGCONT.
		f := (l2 + 1) % 3
		if err := c.Pause(f); err != nil {
			t.Fatal(err)
		}
		if healthy(t, c, f, 300*time.Millisecond) {
			t.Fatalf("paused %s answered /healthz", c.Node(f).ID)
		}
		if err := c.Resume(f); err != nil {
			t.Fatal(err)
		}
		if !healthy(t, c, f, 2*time.Second) {
			t.Fatalf("resumed %s does not answer /healthz", c.Node(f).ID)
		}

		// Kill -9 of the leader: reaped, replaced; restart on the same
		// ports and data.
		l3, err := c.WaitLeader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pid := c.Node(l3).PID()
		if err := c.Kill(l3); err != nil {
			t.Fatal(err)
		}
		if alive(pid) || c.Node(l3).PID() != 0 {
			t.Fatalf("killed %s (pid %d) still exists", c.Node(l3).ID, pid)
		}
		if _, err := c.WaitLeader(ctx, l3); err != nil {
			t.Fatal(err)
		}
		if err := c.Restart(l3); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, c.Node(l3).PID())
		if !healthy(t, c, l3, 2*time.Second) {
			t.Fatalf("restarted %s does not answer", c.Node(l3).ID)
		}

		// A graceful stop exits 0.
		if err := c.Stop(l3); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if err := c.Restart(l3); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, c.Node(l3).PID())
		// Pause one node and leave it paused: the clean-up must kill it.
		if err := c.Pause(l3); err != nil {
			t.Fatal(err)
		}
	})
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("dlockd pid %d outlived its test", pid)
		}
	}
}

// TestCluster_DelayLinks checks that delayed node-to-node links still
// elect and keep a leader, and that DelayLinks(0, 0) removes the delay.
func TestCluster_DelayLinks(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.ClusterOptions{})
	c.DelayLinks(10*time.Millisecond, 30*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(l); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(ctx, l); err != nil {
		t.Fatal(err)
	}
	c.DelayLinks(0, 0)
	if s := c.RaftLink((l+1)%3, (l+2)%3).String(); !strings.Contains(s, "upstream delay [0s, 0s]") {
		t.Fatalf("after DelayLinks(0, 0): %s", s)
	}
}

// TestCluster_JumpClock: JumpClock moves a node's lease clock, so a grant
// with a minute to run ends within seconds of a 2-minute jump.
func TestCluster_JumpClock(t *testing.T) {
	c := servertest.StartCluster(t, 1, servertest.ClusterOptions{TestClock: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := func() bool {
		for ctx.Err() == nil {
			b, code, err := c.Do(ctx, 0, "GET", "/v1/inspect?key=k", nil)
			if err == nil && code == 200 {
				return strings.Contains(string(b), `"held":true`)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("inspect: no answer within 30 s")
		return false
	}
	for {
		_, code, err := c.Do(ctx, 0, "POST", "/v1/acquire", map[string]any{"key": "k", "ttl": "60s"})
		if err == nil && code == 200 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("acquire: %d %v", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !held() {
		t.Fatal("not held after the acquisition")
	}
	if off, err := c.JumpClock(0, 2*time.Minute); err != nil || off != 2*time.Minute {
		t.Fatalf("JumpClock: %v %v", off, err)
	}
	jumped := time.Now()
	for held() {
		if time.Since(jumped) > 10*time.Second {
			t.Fatal("the grant outlived a 2-minute jump of the lease clock by 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := servertest.StartCluster(t, 1, servertest.ClusterOptions{}).JumpClock(0, time.Second); err == nil {
		t.Fatal("JumpClock worked on a cluster started without TestClock")
	}
}
