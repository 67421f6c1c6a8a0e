package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dlock-dev/dlock/server/servertest"
)

// scrapeNode returns the metric families node i of c exports on /metrics.
func scrapeNode(t *testing.T, c *servertest.Cluster, i int) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	body, code, err := c.Do(ctx, i, http.MethodGet, "/metrics", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("scrape %s: HTTP %d %v", c.Node(i).ID, code, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("scrape %s: %v", c.Node(i).ID, err)
	}
	return mfs
}

// gaugeBy returns the values of a gauge by the value of one label; a
// missing family is an empty map.
func gaugeBy(mfs map[string]*dto.MetricFamily, name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range mfs[name].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				out[lp.GetValue()] = m.GetGauge().GetValue()
			}
		}
		if label == "" {
			out[""] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestClusterMetrics_LaggingMember cuts the Raft links between the leader
// and one member, leaving its API reachable, writes through the leader and
// checks the leader's view of that member: its lag grows by the writes,
// its last contact keeps growing; the healthy member stays current; the
// cut-off member knows no leader (dlockd_raft_has_leader 0) while the
// others do; followers export no member series. Healed, every member is
// current again; a member killed has no lag series and a last contact
// (the leader's own) that grows.
func TestClusterMetrics_LaggingMember(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.ClusterOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	l, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lagging, healthy := (l+1)%3, (l+2)%3
	lagID, okID := c.Node(lagging).ID, c.Node(healthy).ID

	// Every member registered and answering: both series for both.
	var mfs map[string]*dto.MetricFamily
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mfs = scrapeNode(t, c, l)
		lag := gaugeBy(mfs, "dlockd_cluster_member_lag_entries", "member")
		lc := gaugeBy(mfs, "dlockd_cluster_member_last_contact_seconds", "member")
		if len(lag) == 2 && len(lc) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leader %s: member series lag %v, last contact %v; want both members in each", c.Node(l).ID, lag, lc)
		}
	}
	if _, self := gaugeBy(mfs, "dlockd_cluster_member_lag_entries", "member")[c.Node(l).ID]; self {
		t.Error("the leader exports a lag series for itself")
	}
	for i := range 3 {
		fam := scrapeNode(t, c, i)
		if v := gaugeBy(fam, "dlockd_raft_has_leader", "")[""]; v != 1 {
			t.Errorf("%s: dlockd_raft_has_leader %v, want 1", c.Node(i).ID, v)
		}
		if i != l && len(fam["dlockd_cluster_member_lag_entries"].GetMetric())+len(fam["dlockd_cluster_member_last_contact_seconds"].GetMetric()) > 0 {
			t.Errorf("follower %s exports member series", c.Node(i).ID)
		}
	}

	// Cut only the Raft links leader <-> lagging (both directions); the
	// forwarded status calls and the APIs still pass.
	for _, p := range []interface {
		Hold()
		Cut() int
	}{c.RaftLink(l, lagging), c.RaftLink(lagging, l)} {
		p.Hold()
		p.Cut()
	}
	const writes = 40
	for k := range writes {
		body, code, err := c.Do(ctx, l, http.MethodPost, "/v1/acquire", map[string]any{"key": fmt.Sprintf("lag:%d", k), "ttl": "60s"})
		if err != nil || code != http.StatusOK {
			t.Fatalf("acquire lag:%d on the leader: HTTP %d %v %s", k, code, err, body)
		}
	}
	var first float64
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		mfs = scrapeNode(t, c, l)
		lag := gaugeBy(mfs, "dlockd_cluster_member_lag_entries", "member")
		lc := gaugeBy(mfs, "dlockd_cluster_member_last_contact_seconds", "member")
		if lag[lagID] >= writes && lc[lagID] > 1 && lag[okID] < writes && lc[okID] < 1 {
			first = lc[lagID]
			t.Logf("leader %s: lag %v, last contact %v", c.Node(l).ID, lag, lc)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leader %s after cutting %s and %d writes: lag %v, last contact %v; want %s lag >= %d and contact > 1s, %s current",
				c.Node(l).ID, lagID, writes, lag, lc, lagID, writes, okID)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if lc := gaugeBy(scrapeNode(t, c, l), "dlockd_cluster_member_last_contact_seconds", "member")[lagID]; lc < first+0.4 {
		t.Errorf("last contact of %s went from %.2fs to %.2fs in 0.5s; want it to keep growing", lagID, first, lc)
	}
	// The cut-off member hears from no leader: it is a candidate, and
	// the healthy one keeps following (it rejects the candidate's votes
	// while it hears from the leader).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if v := gaugeBy(scrapeNode(t, c, lagging), "dlockd_raft_has_leader", "")[""]; v == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s cut off from the leader still reports dlockd_raft_has_leader 1", lagID)
		}
	}

	// Healed: the member catches up, the lag and contact fall back.
	for _, p := range []interface {
		Cut() int
		Release()
	}{c.RaftLink(l, lagging), c.RaftLink(lagging, l)} {
		p.Cut() // drop what was held: a partition loses packets
		p.Release()
	}
	lead, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		mfs = scrapeNode(t, c, lead)
		lag := gaugeBy(mfs, "dlockd_cluster_member_lag_entries", "member")
		lc := gaugeBy(mfs, "dlockd_cluster_member_last_contact_seconds", "member")
		caught := len(lag) == 2 && len(lc) == 2
		for id := range lag {
			caught = caught && lag[id] < writes && lc[id] < 1
		}
		if caught {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after healing, leader %s: lag %v, last contact %v; want every member current", c.Node(lead).ID, lag, lc)
		}
	}

	// A member that is down answers no status: no lag series, and the
	// last contact is the leader's own (its failing heartbeats), growing.
	down := (lead + 1) % 3
	downID := c.Node(down).ID
	if err := c.Kill(down); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		mfs = scrapeNode(t, c, lead)
		lag := gaugeBy(mfs, "dlockd_cluster_member_lag_entries", "member")
		lc := gaugeBy(mfs, "dlockd_cluster_member_last_contact_seconds", "member")
		_, hasLag := lag[downID]
		if !hasLag && lc[downID] > 1 {
			t.Logf("leader %s with %s down: lag %v, last contact %v", c.Node(lead).ID, downID, lag, lc)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leader %s with %s killed: lag %v, last contact %v; want no lag series for it and its contact > 1s", c.Node(lead).ID, downID, lag, lc)
		}
	}
}

// TestClusterMetrics_InProcess runs the member metrics in the test process
// (so -race sees the Raft observer and the scrape-time status calls): the
// leader exports both members' series, a follower none; with a follower
// stopped, the leader still reports its last contact (from its failing
// heartbeats) but no lag.
func TestClusterMetrics_InProcess(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	l := waitLeader(t, nodes, -1)
	waitUntil(t, "every member registered", func() bool { return registered(nodes, 3) })
	scrapeHTTP := func(i int) map[string]*dto.MetricFamily {
		t.Helper()
		resp, err := http.Get("http://" + nodes[i].cfg.Listen + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return mfs
	}
	waitUntil(t, "both members' series on the leader", func() bool {
		mfs := scrapeHTTP(l)
		return len(mfs["dlockd_cluster_member_lag_entries"].GetMetric()) == 2 && len(mfs["dlockd_cluster_member_last_contact_seconds"].GetMetric()) == 2
	})
	f := (l + 1) % 3
	if mfs := scrapeHTTP(f); len(mfs["dlockd_cluster_member_lag_entries"].GetMetric()) != 0 || gaugeBy(mfs, "dlockd_raft_has_leader", "")[""] != 1 {
		t.Errorf("follower %s: member series %v, has_leader %v", nodes[f].cfg.NodeID, mfs["dlockd_cluster_member_lag_entries"], gaugeBy(mfs, "dlockd_raft_has_leader", ""))
	}
	if term := gaugeBy(scrapeHTTP(l), "dlockd_raft_term", "")[""]; term < 1 {
		t.Errorf("leader's dlockd_raft_term %v, want >= 1", term)
	}
	// Every member decodes batch entries: the leader batches once its
	// probe has their answers; a follower never writes entries.
	waitUntil(t, "the leader's dlockd_raft_batching 1", func() bool {
		return gaugeBy(scrapeHTTP(l), "dlockd_raft_batching", "")[""] == 1
	})
	if v, ok := gaugeBy(scrapeHTTP(f), "dlockd_raft_batching", "")[""]; !ok || v != 0 {
		t.Errorf("follower %s: dlockd_raft_batching %v (present %v), want 0", nodes[f].cfg.NodeID, v, ok)
	}
	if modes := gaugeBy(scrapeHTTP(f), "dlockd_raft_batching_mode", "mode"); len(modes) != 1 || modes["auto"] != 1 {
		t.Errorf("follower %s: dlockd_raft_batching_mode %v, want mode=auto 1 (the default)", nodes[f].cfg.NodeID, modes)
	}
	stopped := nodes[f].cfg.NodeID
	nodes[f].stop(t)
	waitUntil(t, "the stopped member's contact from the leader's heartbeats", func() bool {
		mfs := scrapeHTTP(l)
		_, lag := gaugeBy(mfs, "dlockd_cluster_member_lag_entries", "member")[stopped]
		return !lag && gaugeBy(mfs, "dlockd_cluster_member_last_contact_seconds", "member")[stopped] > 0.5
	})
}
