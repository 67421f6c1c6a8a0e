package bench

// BenchmarkCluster is the run behind the cluster section of
// docs/BENCHMARKS.md: a 3-node etcd, a 3-node and a 5-node dlockd (and a
// 3-node dlockd with etcd's 500 ms election timeout), started
// here on loopback (one cluster at a time, each stopped by PID before the
// next starts), W1 (1, 8, 64 clients) and W2 (8, 64 clients) against each,
// then the failover time of each (kill -9 of the leader to the first grant
// of a free key, over BENCH_FAILOVER_TRIES kills).
//
//	make bench-cluster                     # writes docs/BENCHMARKS-cluster-run.md
//	BENCH_DURATION=3s BENCH_FAILOVER_TRIES=20 BENCH_CLUSTERS=etcd3,dlockd3,dlockd5,dlockd3-500ms \
//	  BENCH_OUT=/tmp/cluster.md go test -run '^$' -bench Cluster -benchtime 1x -timeout 30m ./internal/bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server/servertest"
)

func TestMeasureFailover_ReportsEveryTry(t *testing.T) {
	kills, recovers := 0, 0
	f, err := MeasureFailover(t.Context(), FailoverConfig{
		Store: "mem://bench-failover", Tries: 3,
		KillLeader: func(context.Context) (time.Time, error) { kills++; return time.Now().Add(-10 * time.Millisecond), nil },
		Recover:    func(context.Context) error { recovers++; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if kills != 3 || recovers != 3 || f.Tries != 3 || f.P50Ms < 10 || f.MaxMs < f.P50Ms || f.MinMs > f.P50Ms {
		t.Fatalf("kills %d recovers %d result %+v", kills, recovers, f)
	}
	var buf bytes.Buffer
	ClusterReport{Labels: map[string]string{"mem://bench-failover": "mem"}, Failover: []Failover{f}}.Markdown(&buf)
	if !strings.Contains(buf.String(), "| mem | 3 |") {
		t.Fatalf("markdown:\n%s", buf.String())
	}
	_, err = MeasureFailover(t.Context(), FailoverConfig{
		Store: "mem://bench-failover", Tries: 1,
		KillLeader: func(context.Context) (time.Time, error) { return time.Time{}, errors.New("no leader") },
		Recover:    func(context.Context) error { return nil },
	})
	if err == nil || !strings.Contains(err.Error(), "no leader") {
		t.Fatalf("a failing kill: %v", err)
	}
}

func envInt(b *testing.B, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		return n
	}
	return def
}

func BenchmarkCluster(b *testing.B) {
	defer servertest.Cleanup()
	dur := 3 * time.Second
	if v := os.Getenv("BENCH_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("BENCH_DURATION: %v", err)
		}
		dur = d
	}
	tries := envInt(b, "BENCH_FAILOVER_TRIES", 20)
	only := os.Getenv("BENCH_CLUSTERS")
	if only == "" {
		only = "etcd3,dlockd3,dlockd5,dlockd3-500ms"
	}
	for range b.N {
		rep := ClusterReport{Labels: map[string]string{}}
		for _, name := range strings.Split(only, ",") {
			var (
				store        string
				kill         func(context.Context) (time.Time, error)
				recoverNodes func(context.Context) error
				stop         func()
			)
			switch name {
			case "etcd3":
				c := testservers.StartEtcdCluster(b, 3)
				store, stop = c.URL(), func() {}
				killed := -1
				kill = func(ctx context.Context) (time.Time, error) {
					i := c.Leader()
					if i < 0 {
						return time.Time{}, errors.New("no etcd member says it is the leader")
					}
					killed = i
					t0 := time.Now()
					c.Kill(i)
					return t0, nil
				}
				recoverNodes = func(ctx context.Context) error {
					if err := c.Restart(killed); err != nil {
						return err
					}
					return waitUntil(ctx, 30*time.Second, func() bool { return c.Leader() >= 0 })
				}
				rep.Labels[store] = "etcd 3.4, 3 nodes"
			case "dlockd3", "dlockd5", "dlockd3-500ms", "dlockd3-nobatch":
				n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(name, "dlockd"), "-500ms"), "-nobatch"))
				var extra []string
				if strings.HasSuffix(name, "-nobatch") {
					// One Raft entry per command: what batching gains (by
					// default a cluster batches once every member has said
					// it decodes batch entries; server/doc.go, Batching).
					extra = []string{"--batching", "off"}
				}
				if strings.HasSuffix(name, "-500ms") {
					// etcd's election timeout in these runs.
					extra = []string{"--raft-heartbeat-timeout", "500ms", "--raft-election-timeout", "500ms", "--raft-leader-lease-timeout", "250ms"}
				}
				c := startDlockdCluster(b, n, extra...)
				store, stop = c.URL(), c.stopAll
				killed := -1
				kill = func(ctx context.Context) (time.Time, error) {
					i, err := c.leader(ctx)
					if err != nil {
						return time.Time{}, err
					}
					killed = i
					t0 := time.Now()
					return t0, c.kill(i)
				}
				recoverNodes = func(ctx context.Context) error { return c.restart(ctx, killed) }
				rep.Labels[store] = fmt.Sprintf("dlockd, %d nodes", n)
				if strings.HasSuffix(name, "-500ms") {
					rep.Labels[store] += ", Raft timeouts 500 ms"
				}
				if strings.HasSuffix(name, "-nobatch") {
					rep.Labels[store] += ", one entry per command (--batching off)"
				}
			default:
				b.Fatalf("BENCH_CLUSTERS: unknown cluster %q (etcd3, dlockd3, dlockd5, dlockd3-500ms, dlockd3-nobatch)", name)
			}
			r, err := Run(b.Context(), Config{
				Stores: []string{store}, Duration: dur, SkipHold: true,
				Progress: func(format string, args ...any) { b.Logf(format, args...) },
			})
			if err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			rep.Uncontended = append(rep.Uncontended, r.Uncontended...)
			rep.Contended = append(rep.Contended, r.Contended...)
			if tries > 0 {
				f, err := MeasureFailover(b.Context(), FailoverConfig{
					Store: store, Tries: tries, KillLeader: kill, Recover: recoverNodes,
					Progress: func(format string, args ...any) { b.Logf(format, args...) },
				})
				if err != nil {
					b.Fatalf("%s: %v", name, err)
				}
				rep.Failover = append(rep.Failover, f)
			}
			stop()
		}
		var buf bytes.Buffer
		rep.Markdown(&buf)
		b.Log("\n" + buf.String())
		if out := os.Getenv("BENCH_OUT"); out != "" {
			if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// waitUntil polls cond every 20 ms until it holds or timeout passes.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("condition not met within %v", timeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// dlockdCluster is n dlockd binaries on loopback started as one static
// cluster (--initial-cluster), with production Raft timings (the defaults
// of cmd/dlockd) and fsync on.
type dlockdCluster struct {
	tb    testing.TB
	bin   string
	nodes []*dlockdNode
	hc    *http.Client
	extra []string // flags of every node
}

type dlockdNode struct {
	id, api, raft, data string
	log                 *os.File

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error
}

// startDlockdCluster starts n dlockd nodes as one cluster and waits until
// it is whole. A node whose free port was taken meanwhile by another
// process (other tests run on this machine) cannot start: the whole cluster
// is started again on new ports, up to 3 times.
func startDlockdCluster(tb testing.TB, n int, extra ...string) *dlockdCluster {
	tb.Helper()
	var last error
	for range 3 {
		c, err := tryStartDlockdCluster(tb, n, extra)
		if err == nil {
			return c
		}
		last = err
		c.stopAll()
	}
	tb.Fatal(last)
	return nil
}

func tryStartDlockdCluster(tb testing.TB, n int, extra []string) (*dlockdCluster, error) {
	c := &dlockdCluster{tb: tb, bin: servertest.Binary(tb), hc: &http.Client{Timeout: 2 * time.Second}, extra: extra}
	dir := tb.TempDir()
	var initial []string
	for i := range n {
		nd := &dlockdNode{
			id: fmt.Sprintf("n%d", i+1), api: servertest.FreePort(tb), raft: servertest.FreePort(tb),
			data: filepath.Join(dir, fmt.Sprintf("data-%d", i+1)),
		}
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("dlockd-%d.log", i+1)))
		if err != nil {
			tb.Fatal(err)
		}
		nd.log = f
		c.nodes = append(c.nodes, nd)
		initial = append(initial, nd.id+"="+nd.raft)
	}
	tb.Cleanup(func() {
		c.stopAll()
		c.hc.CloseIdleConnections()
		for _, nd := range c.nodes {
			if tb.Failed() {
				if b, err := os.ReadFile(nd.log.Name()); err == nil && len(b) > 0 {
					s := string(b)
					if len(s) > 3000 {
						s = "…" + s[len(s)-3000:]
					}
					tb.Logf("dlockd %s log:\n%s", nd.id, s)
				}
			}
			_ = nd.log.Close()
		}
	})
	for i := range c.nodes {
		if err := c.start(i, strings.Join(initial, ",")); err != nil {
			return c, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.waitWhole(ctx, true); err != nil {
		return c, err
	}
	return c, nil
}

// URL returns dlockd://api1,api2,...
func (c *dlockdCluster) URL() string {
	addrs := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		addrs[i] = nd.api
	}
	return "dlockd://" + strings.Join(addrs, ",")
}

func (c *dlockdCluster) start(i int, initial string) error {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd != nil {
		return nil
	}
	args := []string{"--node-id", nd.id, "--listen", nd.api, "--raft-bind", nd.raft, "--data", nd.data, "--log-level", "warn"}
	if initial != "" {
		args = append(args, "--initial-cluster", initial)
	}
	args = append(args, c.extra...)
	cmd := exec.Command(c.bin, args...)
	cmd.Stdout, cmd.Stderr = nd.log, nd.log
	if err := cmd.Start(); err != nil {
		return err
	}
	nd.cmd = cmd
	nd.exited = make(chan error, 1)
	go func(ch chan error) { ch <- cmd.Wait() }(nd.exited)
	return nil
}

// signal sends sig to node i by PID and waits for it to exit.
func (c *dlockdCluster) signal(i int, sig syscall.Signal) error {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return nil
	}
	if err := syscall.Kill(nd.cmd.Process.Pid, sig); err != nil {
		return err
	}
	select {
	case <-nd.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(nd.cmd.Process.Pid, syscall.SIGKILL)
		<-nd.exited
	}
	nd.cmd = nil
	return nil
}

func (c *dlockdCluster) kill(i int) error { return c.signal(i, syscall.SIGKILL) }

func (c *dlockdCluster) stopAll() {
	for i := range c.nodes {
		_ = c.signal(i, syscall.SIGTERM)
	}
}

// restart starts node i again on its data and waits until the cluster has
// a leader and node i is back in contact.
func (c *dlockdCluster) restart(ctx context.Context, i int) error {
	if err := c.start(i, ""); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return c.waitWhole(ctx, false)
}

// clusterStatusJSON is the part of GET /v1/cluster/status read here.
type clusterStatusJSON struct {
	LeaderID string `json:"leader_id"`
	Members  []struct {
		ID           string          `json:"id"`
		AppliedIndex json.RawMessage `json:"applied_index"`
	} `json:"members"`
}

func (c *dlockdCluster) status(ctx context.Context, i int) (*clusterStatusJSON, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.nodes[i].api+"/v1/cluster/status", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: cluster status: HTTP %d", c.nodes[i].id, resp.StatusCode)
	}
	var st clusterStatusJSON
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, err
	}
	return &st, nil
}

// leader returns the index of the leader, asking the live nodes.
func (c *dlockdCluster) leader(ctx context.Context) (int, error) {
	var last error = errors.New("no live node")
	for i, nd := range c.nodes {
		nd.mu.Lock()
		alive := nd.cmd != nil
		nd.mu.Unlock()
		if !alive {
			continue
		}
		st, err := c.status(ctx, i)
		if err != nil {
			last = err
			continue
		}
		for j, o := range c.nodes {
			if o.id == st.LeaderID && st.LeaderID != "" {
				return j, nil
			}
		}
		last = fmt.Errorf("%s knows no leader", nd.id)
	}
	return -1, last
}

// waitWhole waits until every node is running and answers status, and all
// agree on one leader. failExited: return at once when a node has exited
// (it could not bind its ports, say).
func (c *dlockdCluster) waitWhole(ctx context.Context, failExited bool) error {
	var last error
	for {
		if failExited {
			for _, nd := range c.nodes {
				select {
				case err := <-nd.exited:
					nd.exited <- err // for signal's wait
					return fmt.Errorf("dlockd %s exited during startup (%v); log %s", nd.id, err, nd.log.Name())
				default:
				}
			}
		}
		leaders := map[string]bool{}
		ok := true
		for i := range c.nodes {
			st, err := c.status(ctx, i)
			if err != nil {
				last, ok = err, false
				break
			}
			if st.LeaderID == "" {
				last, ok = fmt.Errorf("%s knows no leader", c.nodes[i].id), false
				break
			}
			leaders[st.LeaderID] = true
		}
		if ok && len(leaders) == 1 {
			return nil
		}
		if ok {
			last = fmt.Errorf("nodes disagree on the leader: %v", leaders)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dlockd cluster not whole: %v", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
