package dlocktest

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/dlock-dev/dlock"
)

// lossBase is how late after its validity deadline a lost lease's Done may
// be observed on an idle machine; schedProbe.slack adds what the machine's
// measured scheduling delay calls for (a loaded CI runner under -race).
const lossBase = 50 * time.Millisecond

// schedProbe measures the scheduling delay of this process while a subtest
// waits: a goroutine sleeps 2 ms again and again and records how late it
// wakes. Timing tolerances scale with the worst delay it saw, so they are
// tight on an idle machine and do not flake on a loaded one; ordering checks
// (A's deadline before B's grant) stay exact.
type schedProbe struct {
	stop  chan struct{}
	done  chan struct{}
	worst atomic.Int64
}

// startProbe starts a probe that runs until the subtest ends.
func startProbe(t TB) *schedProbe {
	p := &schedProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	t.Cleanup(p.close)
	return p
}

func (p *schedProbe) run() {
	defer close(p.done)
	const step = 2 * time.Millisecond
	timer := time.NewTimer(step)
	defer timer.Stop()
	due := time.Now().Add(step)
	for {
		select {
		case <-p.stop:
			return
		case <-timer.C:
		}
		if late := time.Since(due); int64(late) > p.worst.Load() {
			p.worst.Store(int64(late))
		}
		due = time.Now().Add(step)
		timer.Reset(step)
	}
}

func (p *schedProbe) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// Worst returns the longest scheduling delay seen so far.
func (p *schedProbe) Worst() time.Duration { return time.Duration(p.worst.Load()) }

// slack returns base plus four times the worst scheduling delay seen: how
// late after its time an event may be observed.
func (p *schedProbe) slack(base time.Duration) time.Duration { return base + 4*p.Worst() }

// lossWatch observes a lease's end from the moment watchDone made it:
// when Done was observed closed, and a reference timer due at the lease's
// deadline (see deadlineRef).
type lossWatch struct {
	done <-chan time.Time
	ref  *deadlineRef
}

// watchDone starts observing ls.Done, and a reference timer at its
// deadline, at once; awaitLost takes the watch, so that a loss that
// happens while the subtest is busy elsewhere is timed when it happens,
// and the machine's timer lateness at the deadline is measured then too.
func watchDone(t TB, ls *dlock.Lease) *lossWatch {
	ch := make(chan time.Time, 1)
	go func() {
		<-ls.Done() // every lease ends: lost, released, or closed with its Locker
		ch <- time.Now()
	}()
	return &lossWatch{done: ch, ref: watchDeadline(t, ls)}
}

// awaitLost waits until ls is lost (at most its deadline plus limit), as
// observed by w (from watchDone, started before the fault and whatever else
// may delay this call: a watch started after the loss would time it by its
// own start), checks that Done closed no later than the
// lease's own final deadline plus the measured slack and that Err matches
// ErrLeaseLost, reports the lateness, and returns when Done was observed.
func awaitLost(t TB, p *schedProbe, ls *dlock.Lease, what string, limit time.Duration, w *lossWatch) time.Time {
	t.Helper()
	watch, ref := w.done, w.ref
	timer := time.NewTimer(time.Until(ls.Deadline()) + limit)
	defer timer.Stop()
	var doneAt time.Time
	// A loss already observed wins over a limit already past (the caller
	// may come late, after waiting for another client's grant): select
	// alone would pick one of two ready cases at random.
	select {
	case doneAt = <-watch:
	default:
		select {
		case doneAt = <-watch:
		case <-timer.C:
			t.Fatalf("%s: lease still held %v after its deadline", what, time.Since(ls.Deadline()))
		}
	}
	late := doneAt.Sub(ls.Deadline())
	// A timer due at the same deadline that fired late says the runtime
	// could not run timers then (the OS descheduled this process on a
	// loaded runner): that lateness is allowed too, since it is not the
	// lease's.
	refLate := ref.lateness(ls, max(late, 0)+lossBase)
	slack := p.slack(lossBase) + refLate
	t.Logf("%s: Done observed %v after the lease's deadline (allowed %v: scheduling delay up to %v, a timer due at the deadline fired %v late)", what, late, slack, p.Worst(), refLate)
	if late > slack {
		t.Errorf("%s: Done closed %v after the lease's deadline, more than the %v allowed", what, late, slack)
	}
	if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
		t.Errorf("%s: Err() = %v, want ErrLeaseLost", what, ls.Err())
	}
	return doneAt
}

// deadlineRef is a timer due at a lease's deadline, re-armed while renewals
// move the deadline on: how late it fires is how late this process ran
// timers at that moment.
type deadlineRef struct {
	done  chan struct{} // closed once it fired at or after the final deadline
	fired atomic.Int64  // UnixNano of its last firing, stored before the lease is read
}

// watchDeadline starts a deadlineRef for ls. A deadline already past when
// it starts earns no lateness (the caller came late, not the timer).
func watchDeadline(t TB, ls *dlock.Lease) *deadlineRef {
	r := &deadlineRef{done: make(chan struct{})}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	due := ls.Deadline()
	if !time.Now().Before(due) {
		close(r.done)
		return r
	}
	go func() {
		defer close(r.done)
		for {
			timer := time.NewTimer(time.Until(due))
			select {
			case <-stop:
				timer.Stop()
				return
			case <-timer.C:
			}
			now := time.Now()
			r.fired.Store(now.UnixNano())
			if due = ls.Deadline(); !due.After(now) {
				return
			} // else renewed meanwhile: fire again at the new deadline
		}
	}()
	return r
}

// lateness returns how late the reference timer fired after the lease's
// final deadline, waiting at most wait for it to finish. A timer that fired
// but has not finished by then (it reads the lease, whose lock may be held:
// a bug this check must catch) counts from its last firing; one that never
// fired counts nothing, since Done was observed, so the process ran then.
func (r *deadlineRef) lateness(ls *dlock.Lease, wait time.Duration) time.Duration {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-r.done:
	case <-timer.C:
	}
	at := r.fired.Load()
	if at == 0 {
		return 0
	}
	return max(time.Unix(0, at).Sub(ls.Deadline()), 0)
}
