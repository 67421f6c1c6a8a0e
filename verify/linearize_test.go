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
