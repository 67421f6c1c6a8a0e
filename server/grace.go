package server

import (
	"time"

	"github.com/hashicorp/raft"
)

// This file holds the waiter grace of a new leader (see Waiters in the
// package doc). A queue entry lives in the FSM, but the request that waits
// on it lives on the node that was the leader: after a leader change, the
// entries of clients not connected to the new leader keep their place for a
// grace period, their waiter's TTL from the election, so that a client that
// reconnects (an acquisition with wait of the same key and owner token)
// finds its FIFO position. An entry not re-attached by then is purged.

// graceRetry is the pause before a failed purge is proposed again.
const graceRetry = 100 * time.Millisecond

// startGrace gives every queue entry whose client is not connected to this
// node its grace, for the current term of leadership. becomeLeader calls it
// after the FSM caught up with the log.
func (s *Server) startGrace() {
	term := s.raft.CurrentTerm()
	var idle []queuedEntry
	for _, q := range s.fsm.queued() {
		if !s.waits.has(q.ko) {
			idle = append(idle, q)
		}
	}
	s.clock.setGrace(term, idle)
	if len(idle) > 0 {
		s.log.Info("dlockd: waiters not connected to the new leader keep their place for their grace", "waiters", len(idle), "term", term)
	}
}

// purgeIdle proposes the removal of the queue entries whose grace ran out,
// while this node is still the leader of the term that gave the grace. An
// entry whose owner re-attached is kept: skipped here when its request
// waits on this node, and in the FSM when a re-attachment was applied after
// the leader read it (its since moved; see opPurgeIdle). A failed proposal
// is tried again after graceRetry, in the same term only.
func (s *Server) purgeIdle(term uint64, gs []graceEntry) {
	if s.raft.State() != raft.Leader || s.raft.CurrentTerm() != term {
		return
	}
	idle := make([]idleEntry, 0, len(gs))
	kept := gs[:0:0]
	for _, g := range gs {
		if !s.waits.has(g.ko) {
			idle = append(idle, idleEntry{key: g.ko.key, owner: g.ko.owner, since: g.since})
			kept = append(kept, g)
		}
	}
	if len(idle) == 0 {
		return
	}
	if _, err := s.propose(&command{op: opPurgeIdle, idle: idle}); err != nil {
		s.log.Warn("dlockd: purge of waiters past their grace failed, retrying", "waiters", len(idle), "err", err)
		s.clock.regrace(term, kept, graceRetry)
		return
	}
	s.log.Info("dlockd: waiters that did not reconnect within their grace removed", "waiters", len(idle))
}
