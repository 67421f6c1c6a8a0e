package verify

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/dlock-dev/dlock/server/historytest"
)

// Findings is what the checkers found in one history. Counts are of
// distinct pairs or operations; durations are in seconds in JSON.
type Findings struct {
	// DoubleGrants counts pairs of holds of one key whose holders acted at
	// once: the later hold was granted before the earlier holder sent its
	// last write. EarlyGrants counts the store's own share: grants made
	// while a correct client could still believe an earlier grant of the
	// key valid (historytest's early grant).
	DoubleGrants int `json:"double_grants"`
	EarlyGrants  int `json:"early_grants"`
	// FenceViolations counts fence regressions and fences answered to two
	// owners.
	FenceViolations int `json:"fence_violations"`
	// StaleWritesAccepted counts register writes accepted after another
	// grant's write with an equal or greater fence had been accepted: 0
	// whenever fences are sound. StaleWritesRefused counts the writes the
	// register refused (fencing stopped a stale holder); WritesAccepted
	// and WritesFailed the others.
	StaleWritesAccepted int `json:"stale_writes_accepted"`
	StaleWritesRefused  int `json:"stale_writes_refused"`
	WritesAccepted      int `json:"writes_accepted"`
	WritesFailed        int `json:"writes_failed"`
	// Grants and FailedAcquires count the clients' Acquire calls;
	// FailedDuringFault those of the failures sent while a fault was on.
	Grants            int `json:"grants"`
	FailedAcquires    int `json:"failed_acquires"`
	FailedDuringFault int `json:"failed_during_fault"`
	// LongestGap is the longest time, from the first fault on, without
	// any grant; Recovery the time from the last heal to the next grant
	// (-1: none came).
	LongestGap time.Duration `json:"longest_gap_ns"`
	Recovery   time.Duration `json:"recovery_ns"`
	// Linearizable is porcupine's verdict on the lock-with-fence model:
	// "ok", "illegal" or "unknown" (timed out).
	Linearizable string `json:"linearizable"`
	// Violations describes the first violations found, for the report.
	Violations []string `json:"violations,omitempty"`
}

// maxDescribed bounds Findings.Violations.
const maxDescribed = 20

// Unsafe reports whether any safety checker failed: a double grant the
// store made, a fence violation, a stale write accepted or a
// non-linearizable history. Double grants caused by a client fault alone
// (DoubleGrants > EarlyGrants) are not in it: no store prevents them; the
// register's refusals show whether fencing caught them.
func (f *Findings) Unsafe() bool {
	return f.EarlyGrants > 0 || f.FenceViolations > 0 || f.StaleWritesAccepted > 0 || f.Linearizable == "illegal"
}

func (f *Findings) describe(format string, args ...any) {
	if len(f.Violations) < maxDescribed {
		f.Violations = append(f.Violations, fmt.Sprintf(format, args...))
	}
}

// Check runs every checker on h. lin, when not nil, receives porcupine's
// HTML visualisation of the lock model's check (written only when the
// verdict is not "ok").
func Check(h *History, lin *Linearization) (*Findings, error) {
	f := &Findings{Recovery: -1}
	rep, err := historytest.Check(h.Ops)
	if err != nil {
		return nil, fmt.Errorf("verify: history: %w", err)
	}
	for _, v := range rep.Violations {
		switch v.Kind {
		case historytest.EarlyGrant:
			f.EarlyGrants++
		case historytest.FenceRegression, historytest.FenceReuse:
			f.FenceViolations++
		default:
			continue
		}
		f.describe("%s", v.String())
	}
	checkHolds(h, f)
	checkWrites(h, f)
	checkLiveness(h, f)
	f.Linearizable = checkLinearizable(h.Ops, lin)
	if f.Linearizable == "illegal" {
		f.describe("porcupine: the history is not linearizable under the lock-with-fence model")
	}
	return f, nil
}

// checkHolds counts double grants: pairs of holds of one key with
// different fences where the later was granted before the earlier
// holder's last write was sent.
func checkHolds(h *History, f *Findings) {
	byKey := map[string][]Hold{}
	for _, x := range h.Holds {
		byKey[x.Key] = append(byKey[x.Key], x)
	}
	for _, hs := range byKey {
		slices.SortFunc(hs, func(a, b Hold) int { return cmp.Compare(a.Granted, b.Granted) })
		for i, a := range hs {
			for _, b := range hs[i+1:] {
				if b.Granted >= a.LastAct {
					break // sorted by Granted: no later hold overlaps a either
				}
				if b.Owner == a.Owner {
					continue
				}
				f.DoubleGrants++
				f.describe("double grant on %q: client %d (fence %d%s) wrote at %s, after client %d (fence %d) was granted at %s",
					a.Key, a.Client, a.Fence, faultNote(a.Fault), ms(a.LastAct), b.Client, b.Fence, ms(b.Granted))
			}
		}
	}
}

func faultNote(s string) string {
	if s == "" {
		return ""
	}
	return ", " + s
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

// checkWrites counts stale writes accepted: walking writes by send time,
// an accepted write whose fence is below the greatest fence accepted (and
// completed) before it was sent, or equal to it but of another owner; or
// one sent after a holder granted later had already written.
func checkWrites(h *History, f *Findings) {
	for _, w := range h.Writes {
		switch {
		case w.Accepted:
			f.WritesAccepted++
		case w.Refused:
			f.StaleWritesRefused++
		default:
			f.WritesFailed++
		}
	}
	for i, stale := range staleWrites(h) {
		if !stale {
			continue
		}
		w := h.Writes[i]
		f.StaleWritesAccepted++
		f.describe("stale write accepted on %q: client %d wrote fence %d at %s after another holder's equal or greater fence had been accepted, or a holder granted later had written",
			w.Key, w.Client, w.Fence, ms(w.Invoke))
	}
}

// staleWrites marks, by index in h.Writes, the accepted writes that are
// stale: below the greatest fence accepted before they were sent, equal
// to it but of another owner (staleByFence), or sent after a holder
// granted later had written (supersededBefore). The report draws the
// same writes red.
func staleWrites(h *History) []bool {
	granted := map[string]time.Duration{} // owner → when its grant came back
	for _, x := range h.Holds {
		granted[x.Owner] = x.Granted
	}
	out := staleAccepted(h.Writes)
	for i, w := range h.Writes {
		if w.Accepted && !out[i] && supersededBefore(h, granted, w) {
			out[i] = true
		}
	}
	return out
}

// supersededBefore reports whether a holder of w's key granted after w's
// holder had sent a write (accepted or refused) that completed before w
// was sent: the newer holder was already acting, so w's holder was stale
// whatever the fences said.
func supersededBefore(h *History, granted map[string]time.Duration, w Write) bool {
	mine, ok := granted[w.Owner]
	if !ok {
		return false
	}
	for _, o := range h.Writes {
		if o.Key != w.Key || o.Owner == w.Owner || o.Complete >= w.Invoke {
			continue
		}
		if g, ok := granted[o.Owner]; ok && g > mine && (o.Accepted || o.Refused) {
			return true
		}
	}
	return false
}

// checkLiveness measures failed acquisitions, the longest time without a
// grant from the first fault on, and the recovery after the last heal.
func checkLiveness(h *History, f *Findings) {
	var grants []time.Duration
	for _, a := range h.Attempts {
		if a.Err == "" {
			f.Grants++
			grants = append(grants, a.Complete)
			continue
		}
		f.FailedAcquires++
		for _, s := range h.Faults {
			if a.Invoke >= s.Start && a.Invoke <= s.End {
				f.FailedDuringFault++
				break
			}
		}
	}
	if len(h.Faults) == 0 {
		return
	}
	slices.Sort(grants)
	first, last := h.Faults[0].Start, h.Faults[0].End
	for _, s := range h.Faults {
		first, last = min(first, s.Start), max(last, s.End)
	}
	prev := first
	for _, g := range grants {
		if g < first {
			continue
		}
		f.LongestGap = max(f.LongestGap, g-prev)
		prev = g
		if f.Recovery < 0 && g >= last {
			f.Recovery = g - last
		}
	}
	f.LongestGap = max(f.LongestGap, h.End-prev)
}
