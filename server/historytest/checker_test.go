package historytest

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Hand-written histories. Times are in milliseconds since the origin.

func msd(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// granted is an acknowledged acquire.
func granted(client int, key, owner string, sent, recv float64, fence uint64, ttl time.Duration) Op {
	return Op{Client: client, Kind: Acquire, Key: key, Owner: owner, TTL: ttl, Invoke: msd(sent), Complete: msd(recv), Outcome: OK, Fence: fence, GrantTTL: ttl}
}

func refused(client int, key, owner string, sent, recv float64, ttl time.Duration) Op {
	return Op{Client: client, Kind: Acquire, Key: key, Owner: owner, TTL: ttl, Invoke: msd(sent), Complete: msd(recv), Outcome: Failed}
}

func renewed(client int, key, owner string, sent, recv float64, ttl time.Duration, out Outcome) Op {
	return Op{Client: client, Kind: Renew, Key: key, Owner: owner, TTL: ttl, Invoke: msd(sent), Complete: msd(recv), Outcome: out}
}

func released(client int, key, owner string, sent, recv float64) Op {
	return Op{Client: client, Kind: Release, Key: key, Owner: owner, Invoke: msd(sent), Complete: msd(recv), Outcome: OK}
}

// lost is the holder's notice, at its client, that its grant ended.
func lost(client int, key, owner string, at float64) Op {
	return Op{Client: client, Kind: Lost, Key: key, Owner: owner, Invoke: msd(at), Complete: msd(at), Outcome: OK}
}

func check(t *testing.T, h []Op) *Report {
	t.Helper()
	for i := range h {
		h[i].ID = i
	}
	rep, err := Check(h)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return rep
}

const ms100, ms300, s2 = 100 * time.Millisecond, 300 * time.Millisecond, 2 * time.Second

// TestCheck_Histories checks hand-written histories: each is clean or has
// exactly the listed violations.
func TestCheck_Histories(t *testing.T) {
	tests := []struct {
		name string
		h    []Op
		want []ViolationKind
	}{{
		name: "clean: grant, renewal, release, handoff to a waiter",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 5, 5, ms100),                // valid until 97
			refused(3, "k", "ownerC01", 20, 22, ms100),                 // held
			renewed(1, "k", "ownerA01", 80, 85, ms100, OK),             // valid until 177
			granted(2, "k", "ownerB01", 10, 152, 9, ms100),             // B waited; granted after A's release
			released(1, "k", "ownerA01", 150, 153),                     // ends A at 150
			granted(3, "k", "ownerC02", 160, 400, 12, ms100),           // granted after B's expiry (B valid until 107)
			renewed(2, "k", "ownerB01", 200, 205, ms100, Failed),       // B's late renewal: lost
			granted(1, "other", "ownerA02", 10, 20, 7, ms100),          // another key, concurrent
			granted(2, "other", "ownerB02", 30, 40, 8, ms100),          // handed over after A02's release
			released(1, "other", "ownerA02", 25, 35),                   // sent before B02 received
			renewed(2, "other", "ownerB02", 100, 101, ms300, OK),       // changed TTL
			granted(3, "other", "ownerC03", 100, 500, 20, time.Second), // after B02's 100+300-5=395
		},
	}, {
		name: "double grant: B granted while A's grant is valid",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 3, 5, ms100), // valid until 97
			granted(2, "k", "ownerB01", 40, 50, 6, ms100),
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "renewal race: renewal with a new TTL acknowledged, then B granted",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms100),             // valid until 97
			renewed(1, "k", "ownerA01", 95, 105, s2, OK),            // valid until 95+2000-22
			granted(2, "k", "ownerB01", 10, 104, 6, time.Second),    // granted at expiry
			released(2, "k", "ownerB01", 200, 201),                  // irrelevant
			granted(3, "k", "ownerC01", 2100, 2110, 9, time.Second), // after A's end: fine
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "holder told of its loss: B granted after A learned it, before A's validity end",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 3, 5, ms100), // valid until 97
			lost(1, "k", "ownerA01", 30),                // A's store pushed the loss
			granted(2, "k", "ownerB01", 40, 50, 6, ms100),
		},
	}, {
		name: "holder told too late: B granted before A learned of its loss",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 3, 5, ms100),
			granted(2, "k", "ownerB01", 40, 50, 6, ms100),
			lost(1, "k", "ownerA01", 60),
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "renewal race lost: the renewal was answered lost, B granted after A's end",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms100),
			renewed(1, "k", "ownerA01", 95, 105, s2, Failed),
			granted(2, "k", "ownerB01", 10, 104, 6, time.Second),
		},
	}, {
		name: "renewal race unanswered: an unknown renewal extends nothing",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms100),
			renewed(1, "k", "ownerA01", 95, 3095, s2, Unknown),
			granted(2, "k", "ownerB01", 10, 104, 6, time.Second),
		},
	}, {
		name: "a lost renewal does not shorten what was acknowledged",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms300),          // valid until 295
			renewed(1, "k", "ownerA01", 100, 102, ms100, Failed), // lost: changes nothing
			granted(2, "k", "ownerB01", 10, 200, 6, ms300),
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "a renewal to a shorter TTL does not shorten what was acknowledged",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms300),    // valid until 295
			renewed(1, "k", "ownerA01", 10, 12, ms100, OK), // until max(295, 107)
			granted(2, "k", "ownerB01", 10, 200, 6, ms300),
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "retried acquire with a long TTL counts as a renewal",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, 200*time.Millisecond),    // valid until 196
			granted(1, "k", "ownerA01", 50, 52, 5, 3600*time.Second),      // retry: until 50+3600000-36002
			granted(2, "k", "ownerB01", 10, 210, 6, 200*time.Millisecond), // granted at the old expiry
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "a renewal with the TTL unset keeps the grant's TTL",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms300),  // until 295
			renewed(1, "k", "ownerA01", 250, 252, 0, OK), // until 250+300-5 = 545
			granted(2, "k", "ownerB01", 10, 500, 6, ms300),
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "a renewal with the TTL unset counts the smallest TTL in flight",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms300),
			renewed(1, "k", "ownerA01", 240, 260, ms100, Unknown), // may have set 100 ms
			renewed(1, "k", "ownerA01", 250, 252, 0, OK),          // until 250+100-3 = 347
			granted(2, "k", "ownerB01", 10, 400, 6, ms300),
		},
	}, {
		name: "release before the next grant ends the validity",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, time.Second),
			renewed(1, "k", "ownerA01", 20, 22, time.Second, OK),
			released(1, "k", "ownerA01", 30, 90), // answered late, sent before B's grant
			granted(2, "k", "ownerB01", 10, 40, 6, time.Second),
		},
	}, {
		name: "release sent after the next grant was received does not excuse it",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, time.Second),
			granted(2, "k", "ownerB01", 10, 40, 6, time.Second),
			released(1, "k", "ownerA01", 50, 52),
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "fence regression: a later grant with a smaller fence",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 5, 10, ms100),
			released(1, "k", "ownerA01", 6, 8),
			granted(2, "k", "ownerB01", 10, 12, 8, ms100),
		},
		want: []ViolationKind{FenceRegression},
	}, {
		name: "concurrent grants may be answered in any fence order",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 20, 10, ms100),
			released(1, "k", "ownerA01", 21, 22),
			granted(2, "k", "ownerB01", 5, 30, 8, ms100), // sent before A's grant was received
		},
		// B (fence 8) was granted first and A (fence 10) received at 20,
		// while B was valid until 5+100-3 = 102: an early grant, not a
		// regression.
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "fence reuse: one fence to two owners",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 5, 10, ms100),
			released(1, "k", "ownerA01", 6, 8),
			granted(2, "k", "ownerB01", 1, 12, 10, ms100),
		},
		want: []ViolationKind{FenceReuse},
	}, {
		name: "claim window: an unclaimed handover is valid only for the window",
		h: []Op{
			{Client: 1, Kind: Acquire, Key: "k", Owner: "ownerA01", TTL: time.Second, Invoke: 0, Complete: msd(10), Outcome: OK, Fence: 5, GrantTTL: time.Second, ClaimWithin: 50 * time.Millisecond},
			granted(2, "k", "ownerB01", 10, 60, 6, time.Second), // after 0+50-12 = 38
		},
	}, {
		name: "claim window: a claimed handover is valid for its TTL",
		h: []Op{
			{Client: 1, Kind: Acquire, Key: "k", Owner: "ownerA01", TTL: time.Second, Invoke: 0, Complete: msd(10), Outcome: OK, Fence: 5, GrantTTL: time.Second, ClaimWithin: 50 * time.Millisecond},
			renewed(1, "k", "ownerA01", 12, 14, time.Second, OK),
			granted(2, "k", "ownerB01", 10, 60, 6, time.Second),
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "ambiguous: an owner with an unanswered acquire is not credited with renewals",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms100),
			{Client: 1, Kind: Acquire, Key: "k", Owner: "ownerA01", TTL: s2, Invoke: msd(20), Complete: msd(3020), Outcome: Unknown},
			renewed(1, "k", "ownerA01", 90, 91, s2, OK),
			granted(2, "k", "ownerB01", 10, 110, 6, time.Second),
		},
	}, {
		name: "an owner's second grant: renewals go to the grant it knew of",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms100),      // until 97
			granted(2, "k", "ownerB01", 10, 120, 6, ms100),   // after A's expiry
			released(2, "k", "ownerB01", 130, 131),           //
			granted(1, "k", "ownerA01", 140, 142, 9, ms100),  // A again, new fence
			renewed(1, "k", "ownerA01", 200, 201, ms100, OK), // renews fence 9: until 297
			granted(3, "k", "ownerC01", 150, 290, 12, ms100), // before 297
		},
		// Fence 5 is not extended by the renewal (B at 120 is fine);
		// fence 9 is.
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "an owner's second grant received after the renewal was sent: ambiguous",
		h: []Op{
			granted(1, "k", "ownerA01", 0, 2, 5, ms100),
			granted(2, "k", "ownerB01", 10, 120, 6, ms100),
			released(2, "k", "ownerB01", 130, 131),
			granted(1, "k", "ownerA01", 90, 160, 9, ms100),   // a retry that made a new grant
			renewed(1, "k", "ownerA01", 150, 155, ms100, OK), // fence 5 or 9? credited to neither
			granted(3, "k", "ownerC01", 150, 200, 12, ms100), // after fence 9's own end 90+97=187
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := check(t, tt.h)
			var got []ViolationKind
			for _, v := range rep.Violations {
				got = append(got, v.Kind)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("violations %v, want %v:\n%v", got, tt.want, rep.Err(0))
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("violations %v, want %v:\n%v", got, tt.want, rep.Err(0))
				}
			}
			if err := rep.Err(0); (err != nil) != (len(tt.want) > 0) || (err != nil && !errors.Is(err, ErrViolations)) {
				t.Fatalf("Err() = %v with %d violations", err, len(rep.Violations))
			}
		})
	}
}

// TestCheck_EarlyGrantDetails: the report names both operations, the
// operation that set the validity end, and the timings.
func TestCheck_EarlyGrantDetails(t *testing.T) {
	rep := check(t, []Op{
		granted(1, "k", "ownerA01", 0, 2, 5, ms100),
		renewed(1, "k", "ownerA01", 95, 105, s2, OK),
		granted(2, "k", "ownerB01", 10, 104, 6, time.Second),
	})
	if len(rep.Violations) != 1 {
		t.Fatalf("want 1 violation, got %v", rep.Err(0))
	}
	v := rep.Violations[0]
	wantEnd := msd(95) + s2 - Drift(s2)
	if v.Kind != EarlyGrant || v.A.Fence != 5 || v.B.Fence != 6 || v.Cause.Kind != Renew || v.ValidUntil != wantEnd || v.Early != wantEnd-msd(104) {
		t.Fatalf("violation %+v: want A fence 5, B fence 6, cause the renewal, valid until %v, early by %v", v, wantEnd, wantEnd-msd(104))
	}
	s := v.String()
	for _, want := range []string{"early grant", `"k"`, "fence 6", "104.0ms", "2073.0ms", "renew", "sent 95.0ms received 105.0ms"} {
		if !strings.Contains(s, want) {
			t.Errorf("report %q does not mention %q", s, want)
		}
	}
}

// TestCheck_Stats counts races on a small history.
func TestCheck_Stats(t *testing.T) {
	rep := check(t, []Op{
		granted(1, "k", "ownerA01", 0, 2, 5, ms100),                     // until 97
		renewed(1, "k", "ownerA01", 90, 92, ms100, OK),                  // near (7 ms before): until 187
		renewed(1, "k", "ownerA01", 100, 101, 200*time.Millisecond, OK), // changed TTL, not near
		granted(1, "k", "ownerA01", 180, 181, 5, ms100),                 // retry, not near (end 296)
		renewed(1, "k", "ownerA01", 295, 297, ms100, Failed),            // near, lost
		granted(2, "k", "ownerB01", 10, 300, 6, ms100),                  // margin 300-296 = 4 ms
	})
	st := rep.Stats
	if len(rep.Violations) != 0 {
		t.Fatalf("unexpected violations: %v", rep.Err(0))
	}
	if st.Grants != 2 || st.Retries != 1 || st.RenewOK != 2 || st.RenewLost != 1 || st.RenewChangedTTL != 1 ||
		st.NearExpiry != 2 || st.NearExpiryOK != 1 || st.Successions != 1 || st.CloseCalls != 1 || st.MinMargin != 4*time.Millisecond {
		t.Fatalf("stats: %s\n%+v", st.Summary(), st)
	}
}

// TestCheck_Malformed: a history the checker cannot judge is an error.
func TestCheck_Malformed(t *testing.T) {
	for name, op := range map[string]Op{
		"completes before sent": renewed(1, "k", "ownerA01", 10, 5, ms100, OK),
		"grant without fence":   granted(1, "k", "ownerA01", 0, 1, 0, ms100),
		"grant without TTL":     granted(1, "k", "ownerA01", 0, 1, 5, 0),
		"unknown kind":          {Kind: 99},
	} {
		if _, err := Check([]Op{op}); err == nil {
			t.Errorf("%s: Check accepted %s", name, &op)
		}
	}
}

// TestRecorder_Concurrent: IDs are dense and every op is kept.
func TestRecorder_Concurrent(t *testing.T) {
	rec := NewRecorder()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				now := rec.Now()
				rec.Add(Op{Client: i, Kind: Renew, Invoke: now, Complete: rec.Now()})
			}
		}()
	}
	wg.Wait()
	ops := rec.Ops()
	if len(ops) != 800 {
		t.Fatalf("%d ops, want 800", len(ops))
	}
	for i, op := range ops {
		if op.ID != i || op.Complete < op.Invoke {
			t.Fatalf("op %d: %s", i, &op)
		}
	}
}

// TestCheck_SharedHistories: Shared grants hold together up to their
// limit; one more is over limit; an Exclusive grant among them is early.
func TestCheck_SharedHistories(t *testing.T) {
	shared := func(op Op, limit int) Op { op.Shared, op.Limit = true, limit; return op }
	tests := []struct {
		name string
		h    []Op
		want []ViolationKind
	}{{
		name: "clean: two permits of 2 at once, a third after one released",
		h: []Op{
			shared(granted(1, "s", "ownerA01", 0, 5, 5, s2), 2),
			shared(granted(2, "s", "ownerB01", 1, 6, 6, s2), 2),
			refused(3, "s", "ownerC01", 10, 12, s2),
			released(1, "s", "ownerA01", 100, 103),
			shared(granted(3, "s", "ownerC01", 20, 104, 9, s2), 2),
		},
	}, {
		name: "three permits of 2 at once",
		h: []Op{
			shared(granted(1, "s", "ownerA01", 0, 5, 5, s2), 2),
			shared(granted(2, "s", "ownerB01", 1, 6, 6, s2), 2),
			shared(granted(3, "s", "ownerC01", 2, 7, 7, s2), 2),
		},
		want: []ViolationKind{OverLimit},
	}, {
		name: "clean: any number of readers (limit 0)",
		h: []Op{
			shared(granted(1, "r", "ownerA01", 0, 5, 5, s2), 0),
			shared(granted(2, "r", "ownerB01", 1, 6, 6, s2), 0),
			shared(granted(3, "r", "ownerC01", 2, 7, 7, s2), 0),
		},
	}, {
		name: "a writer granted while a reader holds",
		h: []Op{
			shared(granted(1, "r", "ownerA01", 0, 5, 5, s2), 0),
			granted(2, "r", "ownerW01", 1, 50, 6, s2),
		},
		want: []ViolationKind{EarlyGrant},
	}, {
		name: "clean: a reader after the writer's release",
		h: []Op{
			granted(2, "r", "ownerW01", 0, 5, 5, s2),
			released(2, "r", "ownerW01", 40, 42),
			shared(granted(1, "r", "ownerA01", 10, 43, 8, s2), 0),
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := check(t, tc.h)
			var got []ViolationKind
			for _, v := range rep.Violations {
				got = append(got, v.Kind)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("violations %v, want %v:\n%v", got, tc.want, rep.Violations)
			}
		})
	}
}
