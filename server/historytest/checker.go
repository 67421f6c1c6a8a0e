// Package historytest records histories of lock operations as clients saw
// them and checks them, exactly, against the safety property "an
// acknowledged lease is never taken early". Its tests drive a real dlockd
// through delaying, reordering TCP proxies (netproxy.Proxy); the recorder
// and the checker are exported so that cluster tests can check their own
// histories ("partition these nodes, pause that one, check this history").
//
// # What a client may believe
//
// Every operation is recorded with the time its request was sent (Invoke)
// and the time its answer was received (Complete), both read from one
// monotonic clock in one process. From its acknowledgments alone a client
// computes how long its grant is valid, as the dlock client does:
//
//   - A grant answered with fence f and TTL t, to a request sent at s, is
//     valid until s + t − drift(t), drift(t) = t/100 + 2ms (Drift). When the
//     answer carries a claim window c (a grant handed over to a waiter), the
//     grant is valid only until s + min(t, c) − drift(t) until a renewal is
//     acknowledged.
//   - Each renewal acknowledged OK, sent at s' with TTL t', moves the end to
//     max(end, s' + t' − drift(t')). An acknowledged Acquire by the owner
//     answered with the same fence (a retried request) counts as a renewal
//     from its send time with the TTL answered. A renewal answered "lost",
//     or not answered, changes nothing.
//   - A Release (or CancelWait) by the owner ends the validity at the time
//     it was sent, whatever its answer: from then on the client no longer
//     relies on the grant. So does a Lost: the time the holder learned
//     that its grant ended.
//
// # Violations
//
// Check reports:
//
//   - early grant: a grant of the same key with a greater fence whose
//     answer was received before the validity end of another grant, as
//     above. The second grant was made at or before that receipt, while the
//     first holder still believed itself valid.
//   - fence regression: a grant whose request was sent after another
//     grant of the key was received, answered with a smaller fence (fences
//     of successive grants of one key strictly increase), or an owner's
//     retry answered with its old fence after a greater fence was granted.
//   - fence reuse: one fence of one key answered to two owners.
//   - over limit: Shared grants (Op.Shared, dlockd's counted permits and
//     readers) do not exclude each other, so two of them holding at once
//     is no early grant; instead more than Op.Limit of them (when it is
//     not 0) each received and not yet at its validity end at one instant
//     is. An Exclusive grant and a Shared one still exclude each other
//     (early grant).
//
// Check is exact: it compares every pair that could violate, and never
// samples. It is sound: a correct server never produces a violation,
// because every time the checker uses is a bound in the safe direction
// (Invoke is taken before the request leaves, Complete after the answer
// arrives, and a renewal or release whose target grant is ambiguous is not
// used to extend anything).
package historytest

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Kind is what an operation asked for.
type Kind int

const (
	// Acquire is a grant request: Acquire with or without wait, or a Wait
	// stream. An Acquire by an owner that already holds the key (a
	// retried request) is recorded as an Acquire too.
	Acquire Kind = iota + 1
	// Renew is one item of a Renew request.
	Renew
	// Release is a Release request.
	Release
	// CancelWait is a CancelWait request; it releases a grant that raced
	// the cancellation, so it ends the owner's validity like a Release.
	CancelWait
	// Lost is not a request: the holder learned that its grant ended (the
	// store pushed the loss, or its own driver gave the grant up), at
	// Invoke. From then on it no longer relies on the grant, so it ends
	// the owner's validity like a Release. (A store that grants the key to
	// another client before its holder learned of the loss still makes an
	// early grant.)
	Lost
)

func (k Kind) String() string {
	switch k {
	case Acquire:
		return "acquire"
	case Renew:
		return "renew"
	case Release:
		return "release"
	case CancelWait:
		return "cancel-wait"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Outcome is how an operation ended, as the client saw it.
type Outcome int

const (
	// Unknown: no definite answer (timeout, broken connection, cancelled
	// call). The operation may or may not have taken effect.
	Unknown Outcome = iota
	// OK: granted (Acquire), extended (Renew), released (Release), done
	// (CancelWait).
	OK
	// Failed: a definite refusal that changed nothing the client holds:
	// the key is held (Acquire without wait), the wait was cancelled with
	// nothing left on the server, the lease is lost (Renew, Release).
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Unknown:
		return "unknown"
	case OK:
		return "ok"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Op is one recorded operation. Times are durations since the history's
// origin (Recorder.Now), on one monotonic clock.
type Op struct {
	// ID numbers the operation in its history (set by Recorder.Add).
	ID int
	// Client names the client (process) that made the call.
	Client int
	Kind   Kind
	Key    string
	Owner  string
	// TTL is the TTL requested: Acquire, Renew (0: unset, the grant keeps
	// its TTL).
	TTL time.Duration
	// Invoke is when the request was sent; Complete when the answer was
	// received (or the call given up).
	Invoke, Complete time.Duration
	Outcome          Outcome
	// Fence, GrantTTL and ClaimWithin are the answer of an Acquire that
	// was granted: the fence, the TTL the server answered (the one the
	// checker uses), and the claim window (0: none): how long from the
	// request the grant is valid until a renewal, when that is less than
	// the TTL (driver.Grant.Window: dlockd's claim window of a handover,
	// an etcd grant's Grant.ValidFor).
	Fence       uint64
	GrantTTL    time.Duration
	ClaimWithin time.Duration
	// Note says more: the error, the method used ("wait stream", "retry").
	Note string
	// Shared, Limit: an Acquire of a Shared grant of a key of Limit
	// permits (0: any number); see the package doc, over limit.
	Shared bool
	Limit  int
}

func (o *Op) String() string {
	s := fmt.Sprintf("#%d client %d %s %q owner %s", o.ID, o.Client, o.Kind, o.Key, short(o.Owner))
	if o.TTL != 0 {
		s += fmt.Sprintf(" ttl=%v", o.TTL)
	}
	s += fmt.Sprintf(" sent %s received %s: %s", ms(o.Invoke), ms(o.Complete), o.Outcome)
	if o.Kind == Acquire && o.Outcome == OK {
		s += fmt.Sprintf(" fence=%d ttl=%v", o.Fence, o.GrantTTL)
		if o.ClaimWithin > 0 {
			s += fmt.Sprintf(" claim-within=%v", o.ClaimWithin)
		}
	}
	if o.Note != "" {
		s += " (" + o.Note + ")"
	}
	return s
}

func short(owner string) string {
	if len(owner) > 12 {
		return owner[:12]
	}
	return owner
}

// ms prints a time since the origin in milliseconds with 0.1 ms precision.
func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

// Drift is the margin a client subtracts from a TTL when it computes its
// validity: 1% of the TTL plus 2 ms, as the dlock client does by default.
func Drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// Recorder collects the operations of concurrent clients on one clock. The
// zero Recorder is not ready; use NewRecorder. It is safe for concurrent
// use.
type Recorder struct {
	origin time.Time
	mu     sync.Mutex
	ops    []Op
}

// NewRecorder returns an empty recorder whose origin is now.
func NewRecorder() *Recorder { return &Recorder{origin: time.Now()} }

// Now returns the time since the origin, on the monotonic clock. Read it
// immediately before sending a request (Invoke) and immediately after its
// answer arrives (Complete).
func (r *Recorder) Now() time.Duration { return time.Since(r.origin) }

// Add records op, sets its ID, and returns the ID.
func (r *Recorder) Add(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = len(r.ops)
	r.ops = append(r.ops, op)
	return op.ID
}

// Ops returns a copy of the operations recorded so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// ViolationKind names the rule a violation breaks.
type ViolationKind string

// The rules Check enforces; see the package doc.
const (
	EarlyGrant      ViolationKind = "early grant"
	FenceRegression ViolationKind = "fence regression"
	FenceReuse      ViolationKind = "fence reuse"
	OverLimit       ViolationKind = "over limit"
)

// Violation is one broken rule, with the operations that show it.
type Violation struct {
	Kind ViolationKind
	Key  string
	// A is the earlier grant (the holder that was still valid, or the
	// grant with the greater fence that was received first); B the grant
	// that breaks the rule.
	A, B Op
	// For an early grant: ValidUntil is A's validity end, set by Cause
	// (A's grant, renewal or retried acquire with the latest end), and
	// Early is how much earlier than ValidUntil B's grant was received.
	ValidUntil time.Duration
	Cause      Op
	Early      time.Duration
	// For over limit: Holders is how many Shared grants held at B's
	// receipt (B included), more than B.Limit.
	Holders int
}

func (v Violation) String() string {
	switch v.Kind {
	case EarlyGrant:
		return fmt.Sprintf("%s on %q: fence %d was granted to another owner and received at %s, %v before the validity end %s of fence %d (owner %s)\n"+
			"\tholder's grant: %s\n\tvalidity set by: %s\n\tother grant:    %s",
			v.Kind, v.Key, v.B.Fence, ms(v.B.Complete), v.Early, ms(v.ValidUntil), v.A.Fence, short(v.A.Owner), &v.A, &v.Cause, &v.B)
	case OverLimit:
		return fmt.Sprintf("%s on %q: %d Shared grants held at once when fence %d was received at %s (limit %d)\n\tgrant: %s",
			v.Kind, v.Key, v.Holders, v.B.Fence, ms(v.B.Complete), v.B.Limit, &v.B)
	case FenceRegression:
		return fmt.Sprintf("%s on %q: a grant requested at %s, after fence %d was received at %s, was answered with fence %d\n\tearlier grant: %s\n\tlater grant:   %s",
			v.Kind, v.Key, ms(v.B.Invoke), v.A.Fence, ms(v.A.Complete), v.B.Fence, &v.A, &v.B)
	default:
		return fmt.Sprintf("%s on %q: fence %d answered to two owners\n\tfirst:  %s\n\tsecond: %s", v.Kind, v.Key, v.A.Fence, &v.A, &v.B)
	}
}

// Stats counts what a history exercised.
type Stats struct {
	Ops int
	// Grants is the number of distinct grants (key, fence) acknowledged;
	// Retries the acknowledged acquires by an owner that answered its
	// existing grant's fence.
	Grants, Retries int
	// AcquireFailed and AcquireUnknown count acquires refused or without a
	// definite answer.
	AcquireFailed, AcquireUnknown int
	// RenewOK, RenewLost and RenewUnknown count renewals by answer;
	// RenewChangedTTL those that asked for a TTL other than the grant's
	// last acknowledged one.
	RenewOK, RenewLost, RenewUnknown, RenewChangedTTL int
	// NearExpiry counts renewals and retried acquires sent less than
	// NearWindow before (or after) the validity end their client knew of
	// at sending; NearExpiryOK those of them acknowledged.
	NearExpiry, NearExpiryOK int
	// Ambiguous counts acknowledged renewals not used because the grant
	// they renewed could not be told (an owner with an unanswered acquire
	// or with two fences).
	Ambiguous int
	// Releases counts Release and CancelWait requests.
	Releases int
	// Successions counts pairs of consecutive grants of a key; CloseCalls
	// those where the next grant was received less than NearWindow after
	// the previous one's validity end, the races the checker had to
	// judge. MinMargin is the smallest such margin (negative: a
	// violation); zero when there were no successions.
	Successions, CloseCalls int
	MinMargin               time.Duration
	// TTLMismatch counts grants answered with a TTL other than requested.
	TTLMismatch int
}

// NearWindow is how close to a validity end a renewal or a succession
// counts as a race in Stats.
const NearWindow = 10 * time.Millisecond

// Report is the result of Check.
type Report struct {
	Violations []Violation
	Stats      Stats
}

// tenure is one grant: key, fence, owner, and what the client knows of it.
type tenure struct {
	key    string
	fence  uint64
	owner  string
	first  *Op   // the grant op received first
	origin *Op   // the grant op sent first; the others are retries
	ext    []*Op // acknowledged ops that set a validity end (grants, retries, renewals)
	// relAt is the send time of the first release that ends it; hasRel
	// says whether there is one.
	relAt  time.Duration
	hasRel bool
	end    time.Duration // effective validity end (after release)
	cause  *Op           // the op that set end (nil: none)
	shared bool          // a Shared grant (Op.Shared of its first answer)
	limit  int
}

type keyOwner struct{ key, owner string }

type keyFence struct {
	key   string
	fence uint64
}

// validityOf returns the validity end that op gives its grant; ttl is the
// TTL a renewal asked for.
func validityOf(op *Op, ttl time.Duration) time.Duration {
	if op.Kind == Acquire {
		return GrantValidUntil(op.Invoke, op.GrantTTL, op.ClaimWithin)
	}
	return GrantValidUntil(op.Invoke, ttl, 0)
}

// GrantValidUntil is the validity end, on the history's clock, of a grant
// asked for at invoke with ttl: invoke plus the TTL less Drift, or, for a
// handover not confirmed yet (claimWithin > 0, Op.ClaimWithin), invoke
// plus the shorter of the TTL and the claim window, less the TTL's drift,
// as the dlock client computes it.
func GrantValidUntil(invoke, ttl, claimWithin time.Duration) time.Duration {
	t := ttl
	if claimWithin > 0 {
		t = min(t, claimWithin)
	}
	return invoke + t - Drift(ttl)
}

// Check checks a history; see the package doc for the rules. The ops may be
// in any order. It returns an error for a malformed history (an op that
// completes before it starts, a grant without a fence or TTL).
func Check(ops []Op) (*Report, error) {
	rep := &Report{}
	st := &rep.Stats
	st.Ops = len(ops)
	all := make([]*Op, len(ops))
	for i := range ops {
		op := &ops[i]
		all[i] = op
		if op.Complete < op.Invoke {
			return nil, fmt.Errorf("historytest: op %s completes before it is sent", op)
		}
		if op.Kind < Acquire || op.Kind > Lost {
			return nil, fmt.Errorf("historytest: op %s: unknown kind", op)
		}
		if op.Kind == Acquire && op.Outcome == OK && (op.Fence == 0 || op.GrantTTL <= 0) {
			return nil, fmt.Errorf("historytest: granted op %s has no fence or no TTL", op)
		}
	}
	slices.SortStableFunc(all, func(a, b *Op) int { return cmp.Compare(a.Invoke, b.Invoke) })

	// Grants: one tenure per (key, fence).
	tenures := make(map[keyFence]*tenure)
	byOwner := make(map[keyOwner][]*Op) // acquire ops of (key, owner), by Invoke
	for _, op := range all {
		if op.Kind != Acquire {
			continue
		}
		ko := keyOwner{op.Key, op.Owner}
		byOwner[ko] = append(byOwner[ko], op)
		switch op.Outcome {
		case Failed:
			st.AcquireFailed++
			continue
		case Unknown:
			st.AcquireUnknown++
			continue
		}
		if op.TTL != 0 && op.GrantTTL != op.TTL {
			st.TTLMismatch++
		}
		k := keyFence{op.Key, op.Fence}
		t := tenures[k]
		switch {
		case t == nil:
			t = &tenure{key: op.Key, fence: op.Fence, owner: op.Owner, first: op, origin: op, shared: op.Shared, limit: op.Limit}
			tenures[k] = t
			st.Grants++
		case t.owner != op.Owner:
			a, b := t.first, op
			if b.Complete < a.Complete {
				a, b = b, a
			}
			rep.Violations = append(rep.Violations, Violation{Kind: FenceReuse, Key: op.Key, A: *a, B: *b})
			continue
		default:
			st.Retries++
			if op.Complete < t.first.Complete {
				t.first = op
			}
		}
		t.ext = append(t.ext, op)
	}
	ownerTenures := make(map[keyOwner][]*tenure)
	for _, t := range tenures {
		ko := keyOwner{t.key, t.owner}
		ownerTenures[ko] = append(ownerTenures[ko], t)
	}

	// Releases end every grant of the owner requested before them.
	var renewals []*Op
	for _, op := range all {
		switch op.Kind {
		case Renew:
			switch op.Outcome {
			case OK:
				st.RenewOK++
			case Failed:
				st.RenewLost++
			default:
				st.RenewUnknown++
			}
			renewals = append(renewals, op)
		case Release, CancelWait, Lost:
			if op.Kind != Lost {
				st.Releases++
			}
			for _, t := range ownerTenures[keyOwner{op.Key, op.Owner}] {
				if t.origin.Invoke < op.Invoke && (!t.hasRel || op.Invoke < t.relAt) {
					t.relAt, t.hasRel = op.Invoke, true
				}
			}
		}
	}

	// Renewals: used only when exactly one grant of the owner can be meant.
	renewalsOf := make(map[keyOwner][]*Op)
	for _, op := range renewals {
		ko := keyOwner{op.Key, op.Owner}
		renewalsOf[ko] = append(renewalsOf[ko], op)
	}
	renewTTL := make(map[*Op]time.Duration)
	renewOf := make(map[*Op]*tenure)
	for _, op := range renewals {
		t, ok := attribute(op, byOwner[keyOwner{op.Key, op.Owner}], tenures)
		if !ok {
			if op.Outcome == OK {
				st.Ambiguous++
			}
			continue
		}
		renewOf[op] = t
		ttl := op.TTL
		known := t.knownTTL(op.Invoke)
		if ttl == 0 {
			// Unset keeps the grant's TTL: the smallest it may have at
			// the server, given TTL changes acknowledged or in flight.
			ttl = known
			for _, o := range renewalsOf[keyOwner{op.Key, op.Owner}] {
				if o != op && o.TTL != 0 && o.Outcome != Failed && o.Invoke < op.Complete {
					ttl = min(ttl, o.TTL)
				}
			}
		} else if ttl != known {
			st.RenewChangedTTL++
		}
		renewTTL[op] = ttl
		if op.Outcome == OK {
			t.ext = append(t.ext, op)
		}
	}

	// Races: renewals and retries sent near the end their client knew of.
	near := func(op *Op, t *tenure) {
		if known, ok := t.endKnownAt(op.Invoke, renewTTL); ok && op.Invoke > known-NearWindow {
			st.NearExpiry++
			if op.Outcome == OK {
				st.NearExpiryOK++
			}
		}
	}
	for _, op := range renewals {
		if t := renewOf[op]; t != nil {
			near(op, t)
		}
	}
	for _, t := range tenures {
		for _, op := range t.ext {
			if op.Kind == Acquire && op != t.origin {
				near(op, t)
			}
		}
	}

	// Validity ends.
	for _, t := range tenures {
		for _, op := range t.ext {
			if e := validityOf(op, renewTTL[op]); t.cause == nil || e > t.end {
				t.end, t.cause = e, op
			}
		}
		if t.hasRel && t.relAt < t.end {
			t.end = t.relAt
		}
	}
	// Early grants: per key, by fence; B.first received before A's end.
	byKey := make(map[string][]*tenure)
	for _, t := range tenures {
		byKey[t.key] = append(byKey[t.key], t)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	first := true
	for _, key := range keys {
		ts := byKey[key]
		slices.SortFunc(ts, func(a, b *tenure) int { return cmp.Compare(a.fence, b.fence) })
		// sufMin[i]: the earliest receipt among ts[i:].
		sufMin := make([]time.Duration, len(ts)+1)
		sufMin[len(ts)] = 1 << 62
		for i := len(ts) - 1; i >= 0; i-- {
			sufMin[i] = min(sufMin[i+1], ts[i].first.Complete)
		}
		for i, a := range ts {
			if i+1 < len(ts) && !(a.shared && ts[i+1].shared) { // Shared grants hold together
				b := ts[i+1]
				margin := b.first.Complete - a.end
				st.Successions++
				if margin < NearWindow {
					st.CloseCalls++
				}
				if first || margin < st.MinMargin {
					st.MinMargin, first = margin, false
				}
			}
			if sufMin[i+1] >= a.end {
				continue
			}
			for _, b := range ts[i+1:] {
				// A grant with a greater fence received before A's
				// request was even sent is a fence regression (reported
				// below), not an early grant.
				if a.shared && b.shared {
					continue // Shared grants do not exclude each other: see overLimit
				}
				if b.first.Complete < a.end && b.first.Complete >= a.origin.Invoke {
					rep.Violations = append(rep.Violations, Violation{
						Kind: EarlyGrant, Key: key, A: *a.first, B: *b.first,
						ValidUntil: a.end, Cause: *a.cause, Early: a.end - b.first.Complete,
					})
				}
			}
		}
	}

	for _, key := range keys {
		rep.Violations = append(rep.Violations, overLimit(key, byKey[key])...)
	}

	// Fence order: a grant requested after another was received has a
	// greater fence.
	var grants []*Op
	for _, op := range all {
		if op.Kind == Acquire && op.Outcome == OK {
			grants = append(grants, op)
		}
	}
	gByKey := make(map[string][]*Op)
	for _, g := range grants {
		gByKey[g.Key] = append(gByKey[g.Key], g)
	}
	for _, key := range keys {
		gs := gByKey[key] // sorted by Invoke (all is)
		byDone := slices.Clone(gs)
		slices.SortStableFunc(byDone, func(a, b *Op) int { return cmp.Compare(a.Complete, b.Complete) })
		var maxOp *Op
		j := 0
		for _, y := range gs {
			for j < len(byDone) && byDone[j].Complete < y.Invoke {
				if maxOp == nil || byDone[j].Fence > maxOp.Fence {
					maxOp = byDone[j]
				}
				j++
			}
			if maxOp != nil && y.Fence < maxOp.Fence {
				rep.Violations = append(rep.Violations, Violation{Kind: FenceRegression, Key: key, A: *maxOp, B: *y})
			}
		}
	}
	slices.SortStableFunc(rep.Violations, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.B.Complete, b.B.Complete), cmp.Compare(a.A.ID, b.A.ID))
	})
	return rep, nil
}

// attribute returns the grant a renewal by (key, owner) renewed, when only
// one can be meant: every acquire of the owner sent before the renewal was
// answered is answered, and either all that were granted have one fence, or
// the greatest fence was received before the renewal was sent (the key
// passed through that grant, so the owner's earlier grants had ended).
func attribute(r *Op, acquires []*Op, tenures map[keyFence]*tenure) (*tenure, bool) {
	var fence uint64
	var latest *Op
	several := false
	for _, a := range acquires {
		if a.Invoke >= r.Complete {
			break
		}
		switch a.Outcome {
		case Failed:
			continue
		case Unknown:
			return nil, false
		}
		if fence != 0 && a.Fence != fence {
			several = true
		}
		fence = a.Fence
		if latest == nil || a.Fence > latest.Fence || a.Fence == latest.Fence && a.Complete < latest.Complete {
			latest = a
		}
	}
	if latest == nil || several && latest.Complete >= r.Invoke {
		return nil, false
	}
	t := tenures[keyFence{r.Key, latest.Fence}]
	if t == nil || t.owner != r.Owner {
		return nil, false
	}
	return t, true
}

// knownTTL returns the TTL of the grant's latest acknowledgment received
// before at: the TTL a renewal sent at at keeps or changes.
func (t *tenure) knownTTL(at time.Duration) time.Duration {
	ttl, last := t.first.GrantTTL, time.Duration(-1<<62)
	for _, op := range t.ext {
		if op.Complete < at && op.Complete > last {
			last = op.Complete
			if op.Kind == Acquire {
				ttl = op.GrantTTL
			} else if op.TTL != 0 {
				ttl = op.TTL
			}
		}
	}
	return ttl
}

// endKnownAt returns the validity end the client knew of at time at: from
// the acknowledgments received before it.
func (t *tenure) endKnownAt(at time.Duration, renewTTL map[*Op]time.Duration) (time.Duration, bool) {
	end, ok := time.Duration(0), false
	for _, op := range t.ext {
		if op.Complete < at {
			if e := validityOf(op, renewTTL[op]); !ok || e > end {
				end, ok = e, true
			}
		}
	}
	return end, ok
}

// Summary is a one-line account of the stats, for test logs.
func (s Stats) Summary() string {
	return fmt.Sprintf("%d ops: %d grants (%d retried acquires answered as renewals, %d acquires refused, %d unanswered, %d answered with another TTL); "+
		"renewals %d ok, %d lost, %d unanswered, %d with a changed TTL, %d ambiguous; %d near expiry (%d acknowledged); %d releases; "+
		"%d successions, %d close calls (next grant within %v of the validity end), smallest margin %v",
		s.Ops, s.Grants, s.Retries, s.AcquireFailed, s.AcquireUnknown, s.TTLMismatch,
		s.RenewOK, s.RenewLost, s.RenewUnknown, s.RenewChangedTTL, s.Ambiguous, s.NearExpiry, s.NearExpiryOK, s.Releases,
		s.Successions, s.CloseCalls, NearWindow, s.MinMargin)
}

// ErrViolations is matched by the error of Report.Err.
var ErrViolations = errors.New("historytest: violations")

// Err returns nil when there is no violation, else an error matching
// ErrViolations that lists up to max of them (max <= 0: all).
func (r *Report) Err(max int) error {
	if len(r.Violations) == 0 {
		return nil
	}
	s := fmt.Sprintf("%d violations", len(r.Violations))
	for i, v := range r.Violations {
		if max > 0 && i == max {
			s += fmt.Sprintf("\n... and %d more", len(r.Violations)-max)
			break
		}
		s += "\n" + v.String()
	}
	return fmt.Errorf("%w: %s", ErrViolations, s)
}

// overLimit returns, for one key's grants, an over-limit violation for
// each Shared grant received while more than its limit of Shared grants
// (itself included) were each received and not yet at their validity end.
func overLimit(key string, ts []*tenure) []Violation {
	var out []Violation
	for _, b := range ts {
		if !b.shared || b.limit == 0 {
			continue
		}
		at := b.first.Complete
		n := 0
		for _, a := range ts {
			if a.shared && a.first.Complete <= at && at < a.end {
				n++
			}
		}
		if n > b.limit {
			out = append(out, Violation{Kind: OverLimit, Key: key, B: *b.first, Holders: n})
		}
	}
	return out
}
