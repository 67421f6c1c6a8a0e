package server

import (
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
)

// verifier runs one leadership check: raft's VerifyLeader, then the commit
// index read after it. *Server is one; tests use fakes.
type verifier interface {
	verifyRound() (commit uint64, err error)
}

// soloLeaderCheck, when set (benchmarks only), makes every caller run its
// own VerifyLeader, as before rounds were shared.
var soloLeaderCheck bool

// leaderCheck shares one leadership check among concurrent callers, the
// read index of the Raft dissertation (Ongaro, section 6.4): renewals
// (which then move in-memory countdowns) and linearizable reads (which then
// wait until the FSM has applied the commit index the round read) need only
// know that this node was still the leader at some moment after they
// arrived. One round is raft's VerifyLeader (a heartbeat answered by a
// quorum), then the commit index read after it.
//
// A caller never joins a round already in flight: that round may have
// started before the caller arrived, and a quorum's answer to it would not
// prove leadership after the caller's arrival (a read could miss a write
// acknowledged in between by a newer leader). Callers that arrive while a
// round runs wait for the next one, which starts when the running one ends
// and serves all of them; so under load there is one round in flight at a
// time, each serving every caller that arrived during the previous one.
//
// The zero value is ready to use.
type leaderCheck struct {
	mu      sync.Mutex
	running bool        // a round is in flight
	next    *checkRound // the round that starts when the running one ends
	rounds  atomic.Uint64
}

// checkRound is one VerifyLeader round and its outcome.
type checkRound struct {
	done   chan struct{} // closed when commit and err are set
	commit uint64        // the commit index read after leadership was verified
	err    error         // VerifyLeader's error
}

// join returns the round the caller must wait for. When none runs, the
// caller runs a new one itself, and join returns it done. Otherwise the
// caller joins the next round (created on first use), which starts after
// the running one ends, hence after the caller arrived.
func (c *leaderCheck) join(v verifier) *checkRound {
	c.mu.Lock()
	if c.running {
		if c.next == nil {
			c.next = &checkRound{done: make(chan struct{})}
		}
		rd := c.next
		c.mu.Unlock()
		return rd
	}
	c.running = true
	rd := &checkRound{done: make(chan struct{})}
	c.mu.Unlock()
	c.runOne(v, rd)
	return rd
}

// runOne runs rd, then hands the next round, if callers joined one
// meanwhile, to a goroutine (its caller need not wait for it).
func (c *leaderCheck) runOne(v verifier, rd *checkRound) {
	c.rounds.Add(1)
	rd.commit, rd.err = v.verifyRound()
	close(rd.done)
	c.mu.Lock()
	next := c.next
	c.next = nil
	if next == nil {
		c.running = false
	}
	c.mu.Unlock()
	if next != nil {
		go c.runOne(v, next)
	}
}

// verifyLeader returns nil once a leadership check that started after the
// call confirmed that a quorum still follows this node, with the commit
// index read after that check. It waits for a round shared with concurrent
// callers (see leaderCheck). Errors: NOT_LEADER or SHUTTING_DOWN API
// errors.
func (s *Server) verifyLeader() (uint64, error) {
	if soloLeaderCheck {
		commit, err := s.verifyRound()
		if err != nil {
			return 0, s.raftErr(err)
		}
		return commit, nil
	}
	rd := s.readIndex.join(s)
	select {
	case <-rd.done:
	case <-s.closing:
		return 0, apiErr(codes.Unavailable, ReasonShuttingDown, "shutting down")
	}
	if rd.err != nil {
		return 0, s.raftErr(rd.err)
	}
	return rd.commit, nil
}

// verifyRound is one leadership check: VerifyLeader, then the commit index.
//
// A sole voter (the latest configuration names this node alone) is its own
// quorum: raft's VerifyLeader then answers from its leader loop without a
// heartbeat (quorum size 1), and this node stays the leader until it steps
// down or the configuration changes. So the check is raft's state read
// directly: the leader loop it would wait for is busy during every log
// write, and a renewal or read waited for an fsync that was not its own
// (the claim of a handed-over grant behind the previous holder's next
// queue entry, ~180 µs of a W2 handoff on the bench machine).
func (s *Server) verifyRound() (uint64, error) {
	if s.soleVoter() {
		if s.raft.State() != raft.Leader {
			return 0, raft.ErrNotLeader
		}
		return s.raft.CommitIndex(), nil
	}
	if err := s.raft.VerifyLeader().Error(); err != nil {
		return 0, err
	}
	return s.raft.CommitIndex(), nil
}

// soleVoter reports whether the latest Raft configuration (committed or
// not: raft counts its quorum from it) has one server, this node, a voter.
func (s *Server) soleVoter() bool {
	servers := s.raft.GetConfiguration().Configuration().Servers
	return len(servers) == 1 && servers[0].ID == raft.ServerID(s.cfg.NodeID) && servers[0].Suffrage == raft.Voter
}
