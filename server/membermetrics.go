package server

// membermetrics.go owns the leader's per-member replication metrics, for
// the "cluster member lagging" alert (deploy/prometheus/alerts.yaml). It
// reads Raft and the members' own status answers at scrape time and keeps
// one small map of failing heartbeats, filled by a Raft observer; it
// touches no lock-table state.
//
// # Cluster member metrics
//
// Only the leader exports them, one series per other member of the Raft
// configuration (the leader itself has none):
//
//	dlockd_cluster_member_lag_entries{member}          entries behind the leader
//	dlockd_cluster_member_last_contact_seconds{member} seconds since the member last heard from the leader
//
// Sources. hashicorp/raft keeps the leader's view of each follower (its
// match index, its last contact) unexported, so at each scrape the leader
// asks every member for its own status (the Cluster Status call with
// local set, as `dlock cluster status` does, in parallel, bounded by 1s):
// lag is the leader's applied index, read before asking, minus the
// member's applied index (never negative; read before, so writes that
// commit while the question is in flight do not count as lag). The last
// contact is the member's own "last heard from the leader", unless the
// leader's heartbeats to it are failing: Raft's FailedHeartbeatObservation
// then gives the leader's own last contact with it, which keeps growing
// while the member is down or cut off. A member that answers no status and
// whose heartbeats do not fail (its API port alone is unreachable) has no
// series at that scrape; neither has a member's lag when it does not
// answer. The cost is one status call per member per scrape.

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// memberStatusTimeout bounds the status questions of one scrape.
const memberStatusTimeout = time.Second

var (
	memberLagDesc = prometheus.NewDesc("dlockd_cluster_member_lag_entries",
		"On the leader: log entries a member is behind (the leader's applied index minus the member's), by member ID; unset when the member does not answer.",
		[]string{"member"}, nil)
	memberContactDesc = prometheus.NewDesc("dlockd_cluster_member_last_contact_seconds",
		"On the leader: seconds since a member last heard from the leader (the leader's own figure while its heartbeats to the member fail), by member ID.",
		[]string{"member"}, nil)
)

// heartbeats records the members whose heartbeats from this leader fail,
// with the leader's last contact with each. Its observe is a Raft
// observation filter that keeps the record and returns false, so Raft
// sends nothing to any channel and no goroutine is needed.
type heartbeats struct {
	mu      sync.Mutex
	failing map[string]time.Time // member ID → leader's last contact with it
}

// observe implements raft.FilterFn.
func (h *heartbeats) observe(o *raft.Observation) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch d := o.Data.(type) {
	case raft.FailedHeartbeatObservation:
		if h.failing == nil {
			h.failing = make(map[string]time.Time)
		}
		h.failing[string(d.PeerID)] = d.LastContact
	case raft.ResumedHeartbeatObservation:
		delete(h.failing, string(d.PeerID))
	case raft.PeerObservation:
		if d.Removed {
			delete(h.failing, string(d.Peer.ID))
		}
	case raft.LeaderObservation:
		// A new term: the replication goroutines that reported are gone
		// (a later leadership starts them again with a fresh contact).
		clear(h.failing)
	}
	return false
}

// lastContact returns the leader's last contact with member id while its
// heartbeats fail.
func (h *heartbeats) lastContact(id string) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.failing[id]
	return t, ok
}

// raftObserver returns the Raft observer that feeds the heartbeat record;
// Start registers it on the node's Raft.
func (m *metrics) raftObserver() *raft.Observer {
	return raft.NewObserver(nil, false, m.heartbeats.observe)
}

// memberCollector exports the leader's per-member metrics (see the file
// comment).
type memberCollector struct{ m *metrics }

// Describe implements prometheus.Collector.
func (c memberCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- memberLagDesc
	ch <- memberContactDesc
}

// Collect implements prometheus.Collector.
func (c memberCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.s
	if !s.raftUp.Load() || s.raft.State() != raft.Leader || s.removed.Load() {
		return
	}
	base := s.raft.AppliedIndex()
	ctx, cancel := context.WithTimeout(context.Background(), memberStatusTimeout)
	defer cancel()
	st, err := s.clusterStatus(ctx, false)
	if err != nil {
		return
	}
	for _, pb := range st.GetMembers() {
		id := pb.GetId()
		if id == s.cfg.NodeID {
			continue
		}
		answered := pb.GetError() == "" && pb.GetState() != ""
		if answered {
			lag := uint64(0)
			if a := pb.GetAppliedIndex(); base > a {
				lag = base - a
			}
			ch <- prometheus.MustNewConstMetric(memberLagDesc, prometheus.GaugeValue, float64(lag), id)
		}
		if t, failing := c.m.heartbeats.lastContact(id); failing {
			ch <- prometheus.MustNewConstMetric(memberContactDesc, prometheus.GaugeValue, time.Since(t).Seconds(), id)
		} else if lc := pb.GetLastContact(); answered && lc != nil {
			ch <- prometheus.MustNewConstMetric(memberContactDesc, prometheus.GaugeValue, lc.AsDuration().Seconds(), id)
		}
	}
}
