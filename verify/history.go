package verify

import (
	"context"
	"sync"
	"time"

	"github.com/dlock-dev/dlock/server/historytest"
)

// Hold is one lease as its client used it: from the moment the grant came
// back (Granted) to the moment the client last acted as its holder
// (LastAct: when its last write to the register was sent; Granted when it
// wrote nothing). Times are since the history's origin.
type Hold struct {
	Client  int           `json:"client"`
	Key     string        `json:"key"`
	Owner   string        `json:"owner"`
	Fence   uint64        `json:"fence"`
	Granted time.Duration `json:"granted_ns"`
	LastAct time.Duration `json:"last_act_ns"`
	// Ended is when the client stopped using the lease: the Release was
	// sent, or the client saw it lost. EndReason says which.
	Ended     time.Duration `json:"ended_ns"`
	EndReason string        `json:"end_reason"`
	// Fault names the client fault that hit this hold ("pause 1.5x",
	// "clock-jump"), if any.
	Fault string `json:"fault,omitempty"`
}

// Write is one write to the fenced register.
type Write struct {
	Client   int           `json:"client"`
	Key      string        `json:"key"`
	Owner    string        `json:"owner"`
	Fence    uint64        `json:"fence"`
	Invoke   time.Duration `json:"invoke_ns"`
	Complete time.Duration `json:"complete_ns"`
	// Accepted: the register stored it. Refused: it answered ErrStaleFence
	// (fencing refused a stale holder). Neither: the write failed
	// otherwise (Err).
	Accepted bool   `json:"accepted"`
	Refused  bool   `json:"refused"`
	Err      string `json:"err,omitempty"`
}

// Attempt is one Acquire as the client saw it (the root API's call, which
// may make many store calls).
type Attempt struct {
	Client   int           `json:"client"`
	Key      string        `json:"key"`
	Invoke   time.Duration `json:"invoke_ns"`
	Complete time.Duration `json:"complete_ns"`
	// Err is empty for a grant.
	Err string `json:"err,omitempty"`
}

// FaultSpan is when one fault was on: from Start (injected) to End
// (healed).
type FaultSpan struct {
	Name  string        `json:"name"`
	Start time.Duration `json:"start_ns"`
	End   time.Duration `json:"end_ns"`
	Note  string        `json:"note,omitempty"`
}

// History is everything one run recorded, on one monotonic clock whose
// origin is the run's start.
type History struct {
	Ops      []historytest.Op `json:"ops"`
	Holds    []Hold           `json:"holds"`
	Writes   []Write          `json:"writes"`
	Attempts []Attempt        `json:"attempts"`
	Faults   []FaultSpan      `json:"faults"`
	// End is when the run stopped; Duration the run's planned length.
	End time.Duration `json:"end_ns"`
}

// recorder collects a History from many goroutines.
type recorder struct {
	ops *historytest.Recorder

	mu       sync.Mutex
	holds    []Hold
	writes   []Write
	attempts []Attempt
	faults   []FaultSpan
	// lastGrant is when the latest successful acquisition completed;
	// granted, when not nil, is closed by the next one (waitGrant).
	lastGrant time.Duration
	granted   chan struct{}
}

func newRecorder() *recorder { return &recorder{ops: historytest.NewRecorder()} }

func (r *recorder) now() time.Duration { return r.ops.Now() }

func (r *recorder) hold(h Hold) {
	r.mu.Lock()
	r.holds = append(r.holds, h)
	r.mu.Unlock()
}

func (r *recorder) write(w Write) {
	r.mu.Lock()
	r.writes = append(r.writes, w)
	r.mu.Unlock()
}

func (r *recorder) attempt(a Attempt) {
	r.mu.Lock()
	r.attempts = append(r.attempts, a)
	if a.Err == "" {
		r.lastGrant = max(r.lastGrant, a.Complete)
		if r.granted != nil {
			close(r.granted) // wake waitGrant
			r.granted = nil
		}
	}
	r.mu.Unlock()
}

// waitGrant returns once an acquisition that completed after since was
// recorded, or when ctx ends or limit passes; it reports whether one was.
func (r *recorder) waitGrant(ctx context.Context, since, limit time.Duration) bool {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		r.mu.Lock()
		got := r.lastGrant > since
		if r.granted == nil {
			r.granted = make(chan struct{})
		}
		ch := r.granted
		r.mu.Unlock()
		if got {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		case <-timer.C:
			return false
		}
	}
}

// fault records a span and returns its index, for the heal to close.
func (r *recorder) fault(f FaultSpan) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, f)
	return len(r.faults) - 1
}

func (r *recorder) healed(i int, at time.Duration, note string) {
	r.mu.Lock()
	r.faults[i].End = at
	if note != "" {
		if r.faults[i].Note != "" {
			r.faults[i].Note += "; "
		}
		r.faults[i].Note += note
	}
	r.mu.Unlock()
}

func (r *recorder) history() *History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &History{
		Ops:      r.ops.Ops(),
		Holds:    append([]Hold(nil), r.holds...),
		Writes:   append([]Write(nil), r.writes...),
		Attempts: append([]Attempt(nil), r.attempts...),
		Faults:   append([]FaultSpan(nil), r.faults...),
		End:      r.now(),
	}
}
