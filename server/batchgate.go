package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// The batch gate: whether the leader may write batch entries (several
// commands in one log entry) in a cluster. A member of a version before
// batching cannot decode them (see "Batching" in the package doc), and a
// member's version is not in the log, so the leader asks: every second
// (and at once when it takes up leadership) it asks every other member of
// the Raft configuration for its own status (Cluster.Status, local), whose
// batch_entries this version sets and earlier ones leave unset. It writes
// batch entries while every other member of the configuration answered
// its latest probe with batch_entries, from the Raft address and node ID
// the configuration names, and that probe is of the current term and
// configuration and no older than batchProbeFresh; any other answer, no
// answer, a configuration changed since (a member added, or removed and
// added again), a new term or a probe too old turns batching off until the
// next probe says otherwise. Nothing of it is replicated: each leader asks
// for itself.

// batchProbeFresh is how long a probe's answers count. Probes run every
// second; a leader whose probes stop (its member loop stalled) stops
// batching.
const batchProbeFresh = 5 * time.Second

// batchProbeTimeout bounds one probe round (all members asked in parallel).
const batchProbeTimeout = time.Second

// batchProbe is the result of one probe round.
type batchProbe struct {
	at time.Time
	// term and confIndex are the Raft term and the index of the
	// configuration the probe was made in: a probe counts only in both,
	// so a leadership lost and won back, or a member added, or removed and
	// added again, waits for a probe of its own.
	term      uint64
	confIndex uint64
	// all: every other member of that configuration answered with
	// batch_entries.
	all bool
}

// batchMode returns Config.Batching, which New stores normal (lower case,
// "" as BatchAuto), so that the proposer's check per round is a compare.
func (s *Server) batchMode() BatchMode { return s.cfg.Batching }

// decodesBatches reports whether this node decodes batch entries, as its
// status answers say: always, except for a test standing in for a member
// of a version before batching (Config.legacyNoBatch).
func (s *Server) decodesBatches() bool { return !s.cfg.legacyNoBatch }

// batchEntries reports whether several commands may share an entry: never
// with Config.Batching BatchNever; always with BatchAlways; otherwise
// while this node is the only server of the Raft configuration, or when
// the latest probe found that every other member decodes batch entries
// (see the batch gate above).
func (s *Server) batchEntries() bool {
	switch s.batchMode() {
	case BatchNever:
		return false
	case BatchAlways:
		return true
	}
	f := s.raft.GetConfiguration()
	servers := f.Configuration().Servers
	if len(servers) == 1 && servers[0].ID == raft.ServerID(s.cfg.NodeID) && servers[0].Suffrage == raft.Voter {
		return true
	}
	return s.membersDecodeBatches(s.raft.CurrentTerm(), f.Index())
}

// membersDecodeBatches reports whether the latest batch probe, still
// fresh and made in term and in the configuration of index confIndex,
// found every other member decoding batch entries.
func (s *Server) membersDecodeBatches(term, confIndex uint64) bool {
	p := s.batchProbe.Load()
	return s.decodesBatches() && p != nil && p.all && time.Since(p.at) <= batchProbeFresh &&
		p.term == term && p.confIndex == confIndex
}

// startBatchProbe starts a probe round in the background unless one is
// running, so that a member that does not answer (a round waits up to
// batchProbeTimeout for it) delays neither memberLoop's registration nor
// its removal checks.
func (s *Server) startBatchProbe() {
	if !s.probing.CompareAndSwap(false, true) {
		return
	}
	s.loops.Add(1)
	go func() {
		defer s.loops.Done()
		defer s.probing.Store(false)
		s.probeBatchMembers()
	}()
}

// probeBatchMembers runs one probe round on the leader of a cluster of
// several members and records its result; on any other node it forgets
// the last one (a later leadership starts from no answers).
func (s *Server) probeBatchMembers() {
	if !s.isLeader() {
		s.batchProbe.Store(nil)
		s.batchLogged = "" // a later leadership logs its own verdict
		return
	}
	term := s.raft.CurrentTerm()
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	conf := f.Configuration()
	if len(conf.Servers) < 2 {
		return
	}
	at := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), batchProbeTimeout)
	defer cancel()
	go func() { // a shutdown ends the round at once
		select {
		case <-s.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	var (
		mu      sync.Mutex
		refused []batchRefusal // each member that did not answer with batch_entries
		wg      sync.WaitGroup
	)
	refuse := func(id, why string) {
		mu.Lock()
		refused = append(refused, batchRefusal{id, why})
		mu.Unlock()
	}
	for _, srv := range conf.Servers {
		if srv.ID == raft.ServerID(s.cfg.NodeID) {
			continue
		}
		rec, ok := s.fsm.member(string(srv.ID))
		if !ok || rec.api == "" {
			refuse(string(srv.ID), unregisteredWhy) // unknown, so no batching
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if why := s.memberDecodesBatches(ctx, string(srv.ID), string(srv.Address), rec.api); why != "" {
				refuse(string(srv.ID), why)
			}
		}()
	}
	wg.Wait()
	s.batchProbe.Store(&batchProbe{at: at, term: term, confIndex: f.Index(), all: len(refused) == 0})
	s.logBatchVerdict(refused)
}

// batchRefusal is a member that kept a probe from finding every member
// decoding batch entries, and why.
type batchRefusal struct{ id, why string }

// unregisteredWhy is why a member not registered yet keeps batching off.
const unregisteredWhy = "API address not registered yet"

// logBatchVerdict logs the leader's batch verdict when it changes:
// "batching on", or "batching off" with the members that kept it off
// (one line per change of that list, not per probe: their errors' text may
// change every round). A new cluster's first probes, before its members
// have registered, log nothing. With Config.Batching on or off the probe
// decides nothing, and nothing is logged.
func (s *Server) logBatchVerdict(refused []batchRefusal) {
	if m := s.batchMode(); m == BatchAlways || m == BatchNever {
		return
	}
	slices.SortFunc(refused, func(a, b batchRefusal) int { return strings.Compare(a.id, b.id) })
	verdict, onlyUnregistered := "on", true
	var members []string
	for i, r := range refused {
		if i == 0 {
			verdict = "off:"
		}
		verdict += " " + r.id
		members = append(members, r.id+": "+r.why)
		onlyUnregistered = onlyUnregistered && r.why == unregisteredWhy
	}
	switch {
	case verdict == s.batchLogged:
		return
	case s.batchLogged == "" && len(refused) > 0 && onlyUnregistered:
		return
	case len(refused) > 0:
		s.log.Warn("dlockd: batching off: one log entry per command until every member answers that it decodes batch entries", "members", strings.Join(members, "; "))
	case s.batchLogged == "":
		s.log.Info("dlockd: batching on: every member decodes batch entries")
	default:
		s.log.Info("dlockd: batching on again: every member decodes batch entries")
	}
	s.batchLogged = verdict
}

// memberDecodesBatches asks the member id at its API address api for its
// own status and returns "" when that member decodes batch entries, or
// why not: the answer must name it, with the Raft address raftAddr the
// configuration gives it (not another node answering at a stale address),
// and report batch_entries.
func (s *Server) memberDecodesBatches(ctx context.Context, id, raftAddr, api string) string {
	c, err := s.peers.client(api)
	if err != nil {
		return fmt.Sprintf("API address %s: %v", api, err)
	}
	r, err := c.Status(forwardCtx(ctx), &dlockv1.ClusterStatusRequest{Local: true})
	if err != nil {
		return fmt.Sprintf("status from %s: %v", api, err)
	}
	if r.GetNodeId() != id || len(r.GetMembers()) != 1 {
		return fmt.Sprintf("%s answered as node %q, not as this member", api, r.GetNodeId())
	}
	own := r.GetMembers()[0]
	switch {
	case own.GetId() != id || own.GetRaftAddr() != raftAddr:
		return fmt.Sprintf("%s answered as node %q at Raft address %s, not %s", api, own.GetId(), own.GetRaftAddr(), raftAddr)
	case !own.GetBatchEntries():
		return "it does not report batch_entries (a version before batching)"
	}
	return ""
}
