package server

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLimits_RefusalLogIsRateLimited: every refusal is counted; a limit
// logs at most one info line per logEvery, and the next line says how many
// refusals it did not log. Limits are rate-limited apart.
func TestLimits_RefusalLogIsRateLimited(t *testing.T) {
	cfg, logs := internalConfig(t)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	l := &limits{}
	l.bind(s)
	l.now = func() time.Time { return now }

	for range 5 {
		l.refused(limitWatchStreams, "watch refused")
	}
	l.refused(limitConnections, "connection refused")
	now = now.Add(logEvery - time.Millisecond)
	l.refused(limitWatchStreams, "watch refused") // still within the interval
	now = now.Add(time.Millisecond)
	l.refused(limitWatchStreams, "watch refused again")

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var watch []string
	for _, line := range lines {
		if strings.Contains(line, "limit=watch_streams") {
			watch = append(watch, line)
		}
		if !strings.Contains(line, "level=INFO") || !strings.Contains(line, `msg="dlockd: limit reached"`) {
			t.Errorf("log line %q: want an info line \"dlockd: limit reached\"", line)
		}
	}
	if len(lines) != 3 || len(watch) != 2 {
		t.Fatalf("log lines:\n%s\nwant 2 for watch_streams and 1 for connections", logs)
	}
	if !strings.Contains(watch[0], "suppressed=0") || !strings.Contains(watch[1], "suppressed=5") || !strings.Contains(watch[1], `detail="watch refused again"`) {
		t.Errorf("watch_streams lines:\n%s\nwant suppressed=0, then suppressed=5", strings.Join(watch, "\n"))
	}
	if n := testutil.ToFloat64(s.metrics.limitRefusals.WithLabelValues(limitWatchStreams)); n != 7 {
		t.Errorf("watch_streams refusals counted: %v, want 7", n)
	}
	if n := testutil.ToFloat64(s.metrics.limitRefusals.WithLabelValues(limitConnections)); n != 1 {
		t.Errorf("connections refusals counted: %v, want 1", n)
	}
}

// TestSessionHub_BacklogOverflow: a subscriber's queue is empty until an
// event arrives, holds up to its backlog, and an event beyond marks it
// overflowed instead of being dropped in silence.
func TestSessionHub_BacklogOverflow(t *testing.T) {
	h := &sessionHub{subs: make(map[string]map[*subscriber]struct{})}
	sub := h.subscribe("session-1", 2)
	other := h.subscribe("session-2", 2)
	if sub.queue != nil {
		t.Fatalf("a new subscriber has a queue of capacity %d", cap(sub.queue))
	}
	for i := range 3 {
		h.lost(&event{key: string(rune('a' + i)), session: "session-1"})
	}
	select {
	case <-sub.wake:
	default:
		t.Fatal("no wake-up")
	}
	evs, overflow := h.take(sub)
	if len(evs) != 2 || evs[0].key != "a" || evs[1].key != "b" || !overflow {
		t.Fatalf("take: %v overflow %v, want a, b and overflow", evs, overflow)
	}
	if evs, overflow := h.take(other); len(evs) != 0 || overflow {
		t.Fatalf("another session's subscriber got %v %v", evs, overflow)
	}
	h.unsubscribe("session-1", sub)
	h.unsubscribe("session-2", other)
	if n := h.count(); n != 0 {
		t.Fatalf("%d sessions left", n)
	}
}
