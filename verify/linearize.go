package verify

import (
	"fmt"
	"os"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/dlock-dev/dlock/server/historytest"
)

// Linearization says where porcupine's visualisation of a failed or
// timed-out check goes.
type Linearization struct {
	// Path is the HTML file written when the verdict is not "ok".
	Path string
	// Timeout bounds the search (zero: 20 s).
	Timeout time.Duration
	// Written is set to Path once the file is written.
	Written string
}

// lockInput is one store call of the lock model.
type lockInput struct {
	kind     historytest.Kind
	key      string
	owner    string
	ttl      time.Duration // requested (0 on a Renew: keep the grant's)
	claim    time.Duration // an Acquire's unconfirmed handover window (Op.ClaimWithin); 0: none
	invoke   time.Duration
	complete time.Duration
}

// grantUntil is the validity end an Acquire gives its grant.
func (in lockInput) grantUntil() time.Duration {
	return historytest.GrantValidUntil(in.invoke, in.ttl, in.claim)
}

// lockOutput is the store's answer: always OK here (refusals and calls
// without an answer are legal at any point and left out), with the fence
// of a grant.
type lockOutput struct{ fence uint64 }

// lockState is one key's lock: the holder (empty: free), the greatest
// fence granted, and the end of the holder's validity as its client
// computes it (grant or renewal send time + TTL − drift).
type lockState struct {
	owner string
	fence uint64
	ttl   time.Duration
	until time.Duration
}

// lockModel is a lock with fences and leases:
//
//   - a grant is legal when the key is free, held by the same owner (a
//     retried request, which must answer the same fence while the owner's
//     validity lasts), or held by a holder, the same owner included, whose
//     validity ended before the grant's answer came back (the store may have
//     expired it, and a retry then makes a new grant); a new grant's fence
//     must be greater than every earlier one;
//   - a renewal answered OK is legal only for the holder, and moves its
//     validity end;
//   - a release by the holder frees the key, and so does the holder's
//     learning that its grant ended (historytest.Lost).
//
// Expiry is not a step: it is the validity end, which only makes a later
// grant legal. This is the rule historytest.Check enforces pairwise; here
// porcupine searches for one order of all the calls of a key that the
// model accepts (Herlihy and Wing's linearizability).
var lockModel = porcupine.Model{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range ops {
			k := op.Input.(lockInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return lockState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(lockState), input.(lockInput), output.(lockOutput)
		switch in.kind {
		case historytest.Acquire:
			if s.owner == in.owner && s.owner != "" && out.fence == s.fence {
				s.ttl = in.ttl
				s.until = max(s.until, in.grantUntil())
				return true, s
			}
			// Another fence for the same owner is a new grant: legal, as
			// for another owner, only once the earlier one's validity ended.
			if s.owner != "" && s.until > in.complete {
				return false, s // the holder was still valid when this grant came back
			}
			if out.fence <= s.fence {
				return false, s
			}
			return true, lockState{owner: in.owner, fence: out.fence, ttl: in.ttl, until: in.grantUntil()}
		case historytest.Renew:
			if s.owner != in.owner {
				return false, s
			}
			ttl := in.ttl
			if ttl == 0 {
				ttl = s.ttl
			}
			s.until = max(s.until, in.invoke+ttl-historytest.Drift(ttl))
			return true, s
		default: // Release, CancelWait, Lost
			if s.owner == in.owner {
				s.owner, s.until = "", 0
			}
			return true, s
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(lockInput), output.(lockOutput)
		switch in.kind {
		case historytest.Acquire:
			return fmt.Sprintf("acquire(%s, ttl %v) → fence %d", short(in.owner), in.ttl, out.fence)
		case historytest.Renew:
			return fmt.Sprintf("renew(%s, ttl %v) → ok", short(in.owner), in.ttl)
		}
		return fmt.Sprintf("%s(%s)", in.kind, short(in.owner))
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		if s.owner == "" {
			return fmt.Sprintf("free, last fence %d", s.fence)
		}
		return fmt.Sprintf("held by %s, fence %d, valid until %s", short(s.owner), s.fence, ms(s.until))
	},
}

func short(owner string) string {
	if len(owner) > 8 {
		return owner[:8]
	}
	return owner
}

// lockOperations turns a history's store calls into porcupine operations:
// acquires and renewals answered OK, and every release and loss notice
// (which ends the owner's validity whatever its answer).
func lockOperations(ops []historytest.Op) []porcupine.Operation {
	var out []porcupine.Operation
	for _, op := range ops {
		switch {
		case op.Kind == historytest.Release || op.Kind == historytest.CancelWait || op.Kind == historytest.Lost:
		case op.Outcome == historytest.OK && (op.Kind == historytest.Acquire || op.Kind == historytest.Renew):
		default:
			continue
		}
		ttl := op.TTL
		if op.Kind == historytest.Acquire && op.GrantTTL > 0 {
			ttl = op.GrantTTL
		}
		out = append(out, porcupine.Operation{
			ClientId: op.Client,
			Input:    lockInput{kind: op.Kind, key: op.Key, owner: op.Owner, ttl: ttl, claim: op.ClaimWithin, invoke: op.Invoke, complete: op.Complete},
			Call:     int64(op.Invoke),
			Output:   lockOutput{fence: op.Fence},
			Return:   int64(op.Complete),
		})
	}
	return out
}

// checkLinearizable checks ops against lockModel and returns "ok",
// "illegal" or "unknown" (the search timed out). When lin is not nil and
// the verdict is not "ok", it writes porcupine's visualisation.
func checkLinearizable(ops []historytest.Op, lin *Linearization) string {
	timeout := 20 * time.Second
	if lin != nil && lin.Timeout > 0 {
		timeout = lin.Timeout
	}
	res, info := porcupine.CheckOperationsVerbose(lockModel, lockOperations(ops), timeout)
	verdict := map[porcupine.CheckResult]string{porcupine.Ok: "ok", porcupine.Illegal: "illegal"}[res]
	if verdict == "" {
		verdict = "unknown"
	}
	if verdict != "ok" && lin != nil && lin.Path != "" {
		if f, err := os.Create(lin.Path); err == nil {
			if porcupine.Visualize(lockModel, info, f) == nil {
				lin.Written = lin.Path
			}
			f.Close()
		}
	}
	return verdict
}
