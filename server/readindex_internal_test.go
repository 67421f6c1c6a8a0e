package server

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// fakeVerifier is a leadership check that blocks until released: started
// receives one value per round started, release lets one round end.
type fakeVerifier struct {
	started chan struct{}
	release chan error
	commit  atomic.Uint64
}

func (f *fakeVerifier) verifyRound() (uint64, error) {
	f.started <- struct{}{}
	err := <-f.release
	return f.commit.Add(1), err
}

func isDone(r *checkRound) bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// TestLeaderCheck_NeverJoinsARoundInFlight: a caller that arrives while a
// round runs waits for the next one (which starts after it arrived), and
// all callers that arrived during one round share the next.
func TestLeaderCheck_NeverJoinsARoundInFlight(t *testing.T) {
	f := &fakeVerifier{started: make(chan struct{}, 8), release: make(chan error)}
	var c leaderCheck
	first := make(chan *checkRound)
	go func() { first <- c.join(f) }() // the first caller runs its round itself
	<-f.started                        // round 1 in flight
	r2 := c.join(f)
	r3 := c.join(f)
	if r3 != r2 {
		t.Fatal("callers arriving during one round got different next rounds")
	}
	f.release <- nil
	r1 := <-first
	if r2 == r1 {
		t.Fatal("a caller joined the round in flight")
	}
	if r1.err != nil || r1.commit != 1 {
		t.Fatalf("round 1: commit %d err %v", r1.commit, r1.err)
	}
	select {
	case <-f.started: // round 2 starts after round 1 ended
	case <-time.After(5 * time.Second):
		t.Fatal("the next round never started")
	}
	if isDone(r2) {
		t.Fatal("round 2 answered before its check ran")
	}
	r4 := c.join(f) // arrives during round 2: round 3
	if r4 == r2 {
		t.Fatal("a caller joined round 2 in flight")
	}
	f.release <- errors.New("not the leader")
	<-r2.done
	if r2.err == nil || r2.commit != 0 && r2.err == nil {
		t.Fatalf("round 2: err %v", r2.err)
	}
	<-f.started
	f.release <- nil
	<-r4.done
	if r4.err != nil || r4.commit != 3 {
		t.Fatalf("round 3: commit %d err %v", r4.commit, r4.err)
	}
	if n := c.rounds.Load(); n != 3 {
		t.Fatalf("%d rounds for 4 callers, want 3", n)
	}
	// Idle again: the next caller runs a round at once.
	go func() { first <- c.join(f) }()
	<-f.started
	f.release <- nil
	if r5 := <-first; !isDone(r5) || r5.commit != 4 {
		t.Fatalf("round 4: done %v commit %d", isDone(r5), r5.commit)
	}
}
