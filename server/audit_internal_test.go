package server

import (
	"testing"
	"time"
)

// TestAudit_DenyLimiter: one line per key per window; the next line counts
// the suppressed ones; the table is bounded, evicting the longest quiet
// key.
func TestAudit_DenyLimiter(t *testing.T) {
	l := newDenyLimiter(10*time.Second, 3)
	t0 := time.Unix(1000, 0)
	if ok, n := l.admit("10.0.0.1", t0); !ok || n != 0 {
		t.Fatalf("first line: %v %d", ok, n)
	}
	for i := range 5 {
		if ok, _ := l.admit("10.0.0.1", t0.Add(time.Duration(i)*time.Second)); ok {
			t.Fatalf("line %d inside the window let through", i)
		}
	}
	if ok, _ := l.admit("10.0.0.2", t0.Add(time.Second)); !ok {
		t.Fatal("another IP's first line suppressed")
	}
	if ok, n := l.admit("10.0.0.1", t0.Add(10*time.Second)); !ok || n != 5 {
		t.Fatalf("line after the window: %v, suppressed %d; want true, 5", ok, n)
	}
	if ok, n := l.admit("10.0.0.1", t0.Add(20*time.Second)); !ok || n != 0 {
		t.Fatalf("a quiet window: %v %d", ok, n)
	}
	// Bounded: 10.0.0.2 is the longest quiet and goes first.
	l.admit("10.0.0.3", t0.Add(21*time.Second))
	l.admit("10.0.0.4", t0.Add(22*time.Second))
	if len(l.m) != 3 || l.order.Len() != 3 {
		t.Fatalf("table holds %d (%d) entries, want 3", len(l.m), l.order.Len())
	}
	if _, ok := l.m["10.0.0.2"]; ok {
		t.Fatal("the longest quiet entry was not evicted")
	}
	if ok, _ := l.admit("10.0.0.4", t0.Add(23*time.Second)); ok {
		t.Fatal("10.0.0.4 inside its window let through")
	}
	if remoteIP("10.0.0.7:50412") != "10.0.0.7" || remoteIP("[::1]:9") != "::1" || remoteIP("") != "" {
		t.Fatal("remoteIP")
	}
}
