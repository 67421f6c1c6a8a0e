package verify

import (
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server/historytest"
)

// The lock model lets an owner whose validity ended get a new fence when
// it asks again (the store expired its grant, and the retry made a new
// one), but not while its validity lasts (that would be the store ending
// a grant early).
func TestLockModel_SameOwnerNewFence(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	acquire := func(invoke, complete int, fence uint64) historytest.Op {
		return historytest.Op{Kind: historytest.Acquire, Key: "k", Owner: "owner-a", TTL: time.Second, Invoke: ms(invoke), Complete: ms(complete), Outcome: historytest.OK, Fence: fence}
	}
	cases := []struct {
		name string
		ops  []historytest.Op
		want string
	}{
		// A wait granted 2 s after it was sent: its validity (sent + TTL)
		// ended before the answer; the retry's grant is new.
		{"new fence after the validity ended", []historytest.Op{acquire(0, 2000, 2), acquire(2001, 2050, 3)}, "ok"},
		{"same fence while valid", []historytest.Op{acquire(0, 100, 2), acquire(200, 250, 2)}, "ok"},
		{"new fence while valid", []historytest.Op{acquire(0, 100, 2), acquire(200, 250, 3)}, "illegal"},
		{"smaller fence after the validity ended", []historytest.Op{acquire(0, 2000, 3), acquire(2001, 2050, 2)}, "illegal"},
	}
	for _, c := range cases {
		if got := checkLinearizable(c.ops, nil); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// TestLockModel_UnconfirmedHandoverEndsAtItsWindow: a grant handed over
// unconfirmed (ClaimWithin, dlockd's claim window) is valid only to its
// window until a renewal confirms it, so a store that passes the key on
// after the window is legal; with a renewal in the window it is not.
func TestLockModel_UnconfirmedHandoverEndsAtItsWindow(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	a := historytest.Op{Kind: historytest.Acquire, Key: "k", Owner: "owner-a", TTL: 30 * time.Second, Invoke: 0, Complete: ms(10), Outcome: historytest.OK, Fence: 2, GrantTTL: 30 * time.Second, ClaimWithin: time.Second}
	renewA := historytest.Op{Kind: historytest.Renew, Key: "k", Owner: "owner-a", TTL: 30 * time.Second, Invoke: ms(20), Complete: ms(30), Outcome: historytest.OK}
	b := historytest.Op{Kind: historytest.Acquire, Key: "k", Owner: "owner-b", TTL: 30 * time.Second, Invoke: ms(100), Complete: ms(2000), Outcome: historytest.OK, Fence: 3, GrantTTL: 30 * time.Second}
	noClaim := a
	noClaim.ClaimWithin = 0
	cases := []struct {
		name string
		ops  []historytest.Op
		want string
	}{
		{"unconfirmed, passed on after the window", []historytest.Op{a, b}, "ok"},
		{"confirmed in the window, passed on", []historytest.Op{a, renewA, b}, "illegal"},
		{"no window, passed on before the TTL", []historytest.Op{noClaim, b}, "illegal"},
	}
	for _, c := range cases {
		if got := checkLinearizable(c.ops, nil); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
