package observe

import (
	"fmt"
	"testing"
	"time"
)

// TestTable_ExpiredOnlyAfterAWholeLeaseUnchanged: a version is expired a
// whole lease after it was first seen, not before; a new version restarts
// the count; Remaining counts down from the lease.
func TestTable_ExpiredOnlyAfterAWholeLeaseUnchanged(t *testing.T) {
	var tb Table
	t0 := time.Now()
	const lease = time.Second
	if got := tb.See("k", "v1", lease, t0); !got.Equal(t0) {
		t.Fatalf("first See = %v, want %v", got, t0)
	}
	if got := tb.See("k", "v1", lease, t0.Add(300*time.Millisecond)); !got.Equal(t0) {
		t.Fatalf("See of the same version = %v, want the first sighting %v", got, t0)
	}
	if tb.Expired("k", "v1", t0.Add(999*time.Millisecond)) {
		t.Fatal("expired before a whole lease")
	}
	if !tb.Expired("k", "v1", t0.Add(lease)) {
		t.Fatal("not expired after a whole lease")
	}
	if tb.Expired("k", "v2", t0.Add(2*lease)) {
		t.Fatal("an unseen version is expired")
	}
	if r := tb.Remaining("k", "v1", lease, t0.Add(400*time.Millisecond)); r != 600*time.Millisecond {
		t.Fatalf("Remaining = %v, want 600ms", r)
	}
	if r := tb.Remaining("k", "v9", lease, t0); r != lease {
		t.Fatalf("Remaining of an unseen version = %v, want the whole lease", r)
	}
	// The holder renewed: the count starts again.
	t1 := t0.Add(800 * time.Millisecond)
	tb.See("k", "v2", lease, t1)
	if tb.Expired("k", "v2", t0.Add(lease+100*time.Millisecond)) || !tb.Expired("k", "v2", t1.Add(lease)) {
		t.Fatal("a new version did not restart the count")
	}
	tb.Forget("k")
	if tb.Expired("k", "v2", t1.Add(10*lease)) || tb.Len() != 0 {
		t.Fatal("Forget kept the entry")
	}
}

// TestTable_Bounded: a full table drops the least recently used entries
// and never grows past Max.
func TestTable_Bounded(t *testing.T) {
	tb := Table{Max: 3}
	t0 := time.Now()
	for i := range 10 {
		tb.See(fmt.Sprint("k", i), "v", time.Second, t0.Add(time.Duration(i)*time.Millisecond))
		if tb.Len() > 3 {
			t.Fatalf("%d entries, Max 3", tb.Len())
		}
	}
	if tb.Expired("k0", "v", t0.Add(time.Hour)) {
		t.Fatal("the oldest entry was kept")
	}
	if !tb.Expired("k9", "v", t0.Add(time.Hour)) {
		t.Fatal("the newest entry was dropped")
	}
}
