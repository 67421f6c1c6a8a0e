package election_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/recipe/election"
)

// roundsConfig shapes a run of campaign/resign rounds.
type roundsConfig struct {
	rounds     int           // leaderships won, in all
	ttl        time.Duration // of each leadership
	pauseEvery int           // about one leadership in pauseEvery is paused instead of resigning
}

// history checks the election's invariants as leaderships are won.
type history struct {
	t  *testing.T
	mu sync.Mutex

	terms    map[uint64]string // term → campaigner
	lastTerm uint64
	cur      *election.Leadership
	curBy    string

	wins, resigns, pauses, freezes, lostEarly int
	doneBeforeWin, deadlineOnly               int           // how the previous leader had ended when the next one won
	worstLate                                 time.Duration // Done after the deadline, worst
	worstGap                                  time.Duration // next win after a paused leader's deadline, worst
	pausedDeadline                            time.Time     // the paused leader's deadline, until the next win
}

// won records a win and checks it: a term never seen, strictly greater
// than every earlier one, and the previous leader's validity over (its
// Done closed, or at least its deadline passed) before this win.
func (h *history) won(by string, lead *election.Leadership, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wins++
	term := lead.Term()
	if other, dup := h.terms[term]; dup {
		h.t.Errorf("term %d won twice: by %s and by %s", term, other, by)
	}
	h.terms[term] = by
	if term <= h.lastTerm {
		h.t.Errorf("term %d won by %s is not greater than the previous term %d", term, by, h.lastTerm)
	}
	h.lastTerm = term
	if prev := h.cur; prev != nil {
		select {
		case <-prev.Done():
			h.doneBeforeWin++
		default:
			// Its timer may not have run yet on a loaded machine, but
			// its deadline must have passed: strictly.
			if dl := prev.Lease().Deadline(); !dl.Before(at) {
				h.t.Errorf("%s won term %d while %s (term %d) was still leader: %v before its deadline",
					by, term, h.curBy, prev.Term(), dl.Sub(at))
			}
			h.deadlineOnly++
		}
	}
	if !h.pausedDeadline.IsZero() {
		if !h.pausedDeadline.Before(at) {
			h.t.Errorf("%s won term %d %v before the paused leader's deadline", by, term, h.pausedDeadline.Sub(at))
		}
		h.worstGap = max(h.worstGap, at.Sub(h.pausedDeadline))
		h.pausedDeadline = time.Time{}
	}
	h.cur, h.curBy = lead, by
}

// runRounds makes campaigners (one per Locker, each over its own driver)
// campaign until cfg.rounds leaderships were won in all. A winner resigns
// after a short hold, or, about once in cfg.pauseEvery, is paused: its
// renewals hang (FaultDriver.BlockRenewals) or its whole driver freezes
// (FaultDriver.Freeze), and it must see its
// leadership lost no later than its deadline (plus scheduling slack), and
// before anyone else wins.
func runRounds(t *testing.T, ls []*dlock.Locker, fs []*dlocktest.FaultDriver, cfg roundsConfig) *history {
	t.Helper()
	h := &history{t: t, terms: map[uint64]string{}}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const slack = 300 * time.Millisecond // timer and scheduling delay on a loaded 2-core machine
	var (
		mu   sync.Mutex
		left = cfg.rounds
	)
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if left == 0 {
			return false
		}
		left--
		return true
	}
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			by := fmt.Sprintf("campaigner-%d", i)
			for take() {
				lead, err := election.Campaign(ctx, l, "rounds", by, dlock.WithTTL(cfg.ttl))
				if err != nil {
					t.Errorf("%s: Campaign: %v", by, err)
					cancel()
					return
				}
				h.won(by, lead, time.Now())
				if rand.IntN(cfg.pauseEvery) == 0 {
					// Paused: the store stops answering this leader's
					// renewals, or the whole client freezes (a GC pause,
					// SIGSTOP: its calls hang and reach the store late).
					freeze := rand.IntN(2) == 0
					pause := func(on bool) {
						if freeze {
							fs[i].Freeze(on)
						} else {
							fs[i].BlockRenewals(on)
						}
					}
					pause(true)
					select {
					case <-lead.Done():
					case <-time.After(cfg.ttl + 5*time.Second):
						t.Errorf("%s: leadership of term %d not lost %v after its renewals hung", by, lead.Term(), cfg.ttl+5*time.Second)
						cancel()
						pause(false)
						return
					}
					doneAt := time.Now()
					dl := lead.Lease().Deadline()
					h.mu.Lock()
					h.pauses++
					if freeze {
						h.freezes++
					}
					late := doneAt.Sub(dl)
					h.worstLate = max(h.worstLate, late)
					if h.cur == lead {
						h.pausedDeadline = dl
					}
					h.mu.Unlock()
					if late > slack {
						t.Errorf("%s: term %d lost %v after its deadline (allowed %v)", by, lead.Term(), late, slack)
					}
					if !errors.Is(lead.Err(), dlock.ErrLeaseLost) {
						t.Errorf("%s: term %d ended with %v, want ErrLeaseLost", by, lead.Term(), lead.Err())
					}
					pause(false)
					continue
				}
				time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
				err = lead.Resign(ctx)
				h.mu.Lock()
				switch {
				case err == nil:
					h.resigns++
				case errors.Is(err, dlock.ErrLeaseLost):
					h.lostEarly++ // a renewal missed its deadline under load: lost, not unsafe
				default:
					t.Errorf("%s: Resign of term %d: %v", by, lead.Term(), err)
				}
				h.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if h.wins != cfg.rounds && !t.Failed() {
		t.Errorf("%d leaderships won, want %d", h.wins, cfg.rounds)
	}
	t.Logf("%d rounds: %d resigned, %d paused (%d of them frozen; lost by deadline), %d lost early; when the next leader won, the previous one's Done was closed %d times, only its deadline passed %d times; worst Done after deadline %v; worst next win after a paused leader's deadline %v; last term %d",
		h.wins, h.resigns, h.pauses, h.freezes, h.lostEarly, h.doneBeforeWin, h.deadlineOnly, h.worstLate, h.worstGap, h.lastTerm)
	return h
}

func TestElection_500Rounds_Mem(t *testing.T) {
	ls, fs := memLockers(t, 3)
	start := time.Now()
	h := runRounds(t, ls, fs, roundsConfig{rounds: 500, ttl: 150 * time.Millisecond, pauseEvery: 15})
	t.Logf("mem: %v", time.Since(start))
	if h.pauses == 0 {
		t.Error("no leadership was paused")
	}
}
