package once

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/fence"
)

// State is the state of a (job, window) record in a Ledger.
type State string

// The states of a record. A window with no record has not run.
const (
	// Started: an attempt began and has not finished: it is running, or
	// its node crashed or was paused. Run retries it once the lock on the
	// job is free again, that is once the attempt's lease was released or
	// expired on the store.
	Started State = "started"
	// Finished: an attempt's fn returned nil. The window never runs again.
	Finished State = "finished"
	// Failed: an attempt's fn returned an error (Record.Error). The next
	// Run in the same window retries it.
	Failed State = "failed"
)

// Record is a Ledger's record of one (job, window): the latest attempt.
type Record struct {
	Job    string
	Window string // the Window ID
	State  State
	// Fence is the fence of the latest attempt's lease on the job's lock
	// key (Key(job)); the ledger accepts a start only with a greater fence
	// and a finish only with this one.
	Fence uint64
	// Owner is the owner token of that lease; Node names the node that
	// ran it (WithNode).
	Owner, Node string
	// Attempt counts the attempts of this window: 1 for the first.
	Attempt int
	// StartedAt is when the latest attempt started and FinishedAt when it
	// finished or failed (zero while Started), both on the ledger's clock.
	StartedAt, FinishedAt time.Time
	// Error is the error of a Failed attempt, as text.
	Error string
}

// StartRequest is what Ledger.Start records.
type StartRequest struct {
	Job, Window string
	Fence       uint64 // > 0
	Owner, Node string
}

// Errors of a Ledger. Errors wrap them with the job and window.
var (
	// ErrNoRecord: the ledger has no record of (job, window) (Ledger.Get).
	ErrNoRecord = errors.New("once: no record")
	// ErrFinished: Ledger.Start on a window that has finished; Run then
	// reports OutcomeDone instead of an error.
	ErrFinished = errors.New("once: window already finished")
	// ErrStaleFence is dlock.ErrStaleFence (and fence.ErrStaleFence), the
	// same value: the ledger refused a start whose fence is not greater than
	// the recorded one, or a finish whose fence is not the recorded
	// attempt's (its holder's lease was lost and another node took over).
	ErrStaleFence = fence.ErrStaleFence
	// ErrClockSkew: the node's clock (WithClock) differs from the ledger's
	// by more than WithMaxSkew allows. Matches dlock.ErrInvalidArgument.
	ErrClockSkew = fmt.Errorf("once: clock skew beyond the allowed maximum: %w", dlock.ErrInvalidArgument)
)

// Ledger records, per (job, window), the start and the finish of each
// attempt with the fence of its lease, and tells the time every node
// agrees on. The rules below are the contract Run relies on; an
// implementation must apply each call atomically:
//
//   - Start inserts a Started record with Attempt 1, or replaces a Started
//     or Failed record whose Fence is smaller than req.Fence (Attempt + 1).
//     A Finished record makes it fail with ErrFinished; a record with a
//     fence ≥ req.Fence with ErrStaleFence (wrapped, naming both fences).
//   - Finish sets a Started record whose Fence is fence to Finished (runErr
//     empty) or Failed (Error = runErr). Any other record, or none, is
//     ErrStaleFence.
//
// Implementations: MemLedger (in-process, for tests and examples),
// recipe/once/sqlledger (PostgreSQL and SQLite, through fence/fencesql).
type Ledger interface {
	// Now returns the ledger's clock: the time that decides the window of
	// every node (PostgreSQL's clock_timestamp(), SQLite's clock of the
	// host sharing the file). Errors are the store's, wrapped.
	Now(ctx context.Context) (time.Time, error)
	// Get returns the record of (job, window), or an error wrapping
	// ErrNoRecord.
	Get(ctx context.Context, job, window string) (Record, error)
	// Start records the start of an attempt (see the rules above) and
	// returns the new record, StartedAt on the ledger's clock.
	Start(ctx context.Context, req StartRequest) (Record, error)
	// Finish records the end of the attempt that started with fence and
	// returns the new record.
	Finish(ctx context.Context, job, window string, fence uint64, runErr string) (Record, error)
}

// MemLedger is a Ledger in this process's memory, for tests and examples:
// it is shared only by the Run calls of one process, and lost with it. Its
// clock is the function given to NewMemLedger. Safe for concurrent use.
type MemLedger struct {
	now func() time.Time

	mu      sync.Mutex
	records map[[2]string]Record
}

// NewMemLedger returns an empty MemLedger whose clock is now (time.Now when
// nil).
func NewMemLedger(now func() time.Time) *MemLedger {
	if now == nil {
		now = time.Now
	}
	return &MemLedger{now: now, records: map[[2]string]Record{}}
}

// Now implements Ledger.
func (m *MemLedger) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	return m.now(), nil
}

// Get implements Ledger.
func (m *MemLedger) Get(ctx context.Context, job, window string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.records[[2]string{job, window}]
	if !ok {
		return Record{}, fmt.Errorf("once: %q window %q: %w", job, window, ErrNoRecord)
	}
	return r, nil
}

// Start implements Ledger.
func (m *MemLedger) Start(ctx context.Context, req StartRequest) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := [2]string{req.Job, req.Window}
	r, ok := m.records[k]
	switch {
	case ok && r.State == Finished:
		return r, fmt.Errorf("once: start %q window %q: %w", req.Job, req.Window, ErrFinished)
	case ok && r.Fence >= req.Fence:
		return r, fmt.Errorf("once: start %q window %q with fence %d: the ledger has fence %d: %w", req.Job, req.Window, req.Fence, r.Fence, ErrStaleFence)
	}
	r = Record{Job: req.Job, Window: req.Window, State: Started, Fence: req.Fence, Owner: req.Owner, Node: req.Node,
		Attempt: r.Attempt + 1, StartedAt: m.now()}
	m.records[k] = r
	return r, nil
}

// Finish implements Ledger.
func (m *MemLedger) Finish(ctx context.Context, job, window string, f uint64, runErr string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := [2]string{job, window}
	r, ok := m.records[k]
	if !ok || r.State != Started || r.Fence != f {
		return r, fmt.Errorf("once: finish %q window %q with fence %d: the ledger has %s with fence %d: %w", job, window, f, describe(r, ok), r.Fence, ErrStaleFence)
	}
	r.State, r.FinishedAt, r.Error = Finished, m.now(), runErr
	if runErr != "" {
		r.State = Failed
	}
	m.records[k] = r
	return r, nil
}

func describe(r Record, ok bool) string {
	if !ok {
		return "no record"
	}
	return "a " + string(r.State) + " attempt"
}
