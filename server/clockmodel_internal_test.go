package server

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// clockModel drives the FSM and the lease clock together, as a leader
// does, on a fake clock: client commands and the leader's expiry proposals
// wait in one log queue and are applied in order, in-memory renewals act on
// the clock at once, and proposals may fail before reaching the log. It
// records what each client was told (the end of its grant's validity,
// measured from when it sent the request, as clients do) and fails when the
// table ends a grant by expiry or unclaimed release before that end, or
// when the clock and the table disagree.
type clockModel struct {
	t     *testing.T
	now   time.Time
	f     *fsm
	c     *leaseClock
	idx   uint64
	log   []modelEntry
	valid map[keyOwner]time.Time // end of the validity a client was told
	trace []string
}

// modelEntry is one proposal in the log queue.
type modelEntry struct {
	c     command
	sent  time.Time
	fired []fired // the leader's proposals: the countdowns they came from
	renew bool    // a renewal with a new TTL (opSetTTL)
}

func (m *clockModel) lockEvents(evs []event) {
	m.c.apply(evs)
	for _, ev := range evs {
		if ev.kind != evRemoved {
			continue
		}
		ko := keyOwner{ev.key, ev.owner}
		if (ev.reason == reasonExpired || ev.reason == reasonUnclaimed) && m.now.Before(m.valid[ko]) {
			m.t.Fatalf("%s of %v at %v, %v before the end of the validity its holder was told\n%s",
				ev.reason, ko, m.now.Sub(time.Unix(0, 0)), m.valid[ko].Sub(m.now), m.dump())
		}
		delete(m.valid, ko)
	}
}

func (m *clockModel) lockReset(state []event)   { m.c.reset(state) }
func (m *clockModel) undecodable(uint64, error) {}

func (m *clockModel) dump() string {
	s := ""
	for _, l := range m.trace {
		s += l + "\n"
	}
	return s
}

func (m *clockModel) logf(format string, a ...any) {
	m.trace = append(m.trace, fmt.Sprintf("%8v ", m.now.Sub(time.Unix(0, 0)))+fmt.Sprintf(format, a...))
}

// applyNext applies the head of the log queue.
func (m *clockModel) applyNext() {
	if len(m.log) == 0 {
		return
	}
	e := m.log[0]
	m.log = m.log[1:]
	m.idx++
	m.logf("apply %d op %d %s/%s ttl %v %v", m.idx, e.c.op, e.c.key, e.c.owner, e.c.ttl, e.c.expiries)
	r := m.f.Apply(&raft.Log{Index: m.idx, Type: raft.LogCommand, Data: e.c.encode()}).(applyResult)
	ko := keyOwner{e.c.key, e.c.owner}
	switch {
	case e.c.op == opAcquire && r.code == resGranted:
		m.valid[ko] = later(m.valid[ko], e.sent.Add(r.ttl))
	case e.renew && r.code == resOK:
		m.valid[ko] = later(m.valid[ko], e.sent.Add(e.c.ttl))
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// check compares the clock with the table: one countdown per held key, of
// its owner, fence and version, and one per key in a lock-delay.
func (m *clockModel) check() {
	if err := m.f.check(); err != nil {
		m.t.Fatalf("%v\n%s", err, m.dump())
	}
	m.f.mu.RLock()
	defer m.f.mu.RUnlock()
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.c.byKey.len() != m.f.locks.len() {
		m.t.Fatalf("%d countdowns, %d keys\n%s", m.c.byKey.len(), m.f.locks.len(), m.dump())
	}
	for k, e := range m.f.locks.all() {
		l := m.c.byKey.get(k)
		switch {
		case l == nil:
			m.t.Fatalf("key %s: no countdown\n%s", k, m.dump())
		case e.held && (l.delay || l.owner != e.grant.owner || l.fence != e.grant.fence || l.version != e.grant.version):
			m.t.Fatalf("key %s: countdown %+v, grant %+v\n%s", k, *l, e.grant, m.dump())
		case !e.held && (!l.delay || l.version != e.delayVersion):
			m.t.Fatalf("key %s: countdown %+v, lock-delay version %d\n%s", k, *l, e.delayVersion, m.dump())
		case len(m.log) == 0 && (l.idx < 0 || l.expiring):
			// Nothing is proposed: a countdown out of the heap would never
			// fire again, and the key would be stuck.
			m.t.Fatalf("key %s: countdown %+v out of the heap with nothing proposed\n%s", k, *l, m.dump())
		}
	}
}

// runClockModel runs one random history of n steps.
func runClockModel(t *testing.T, seed uint64, n int) { runClockModelTrace(t, seed, n, nil) }

func runClockModelTrace(t *testing.T, seed uint64, n int, tr func(string)) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	m := &clockModel{t: t, now: time.Unix(0, 0), valid: map[keyOwner]time.Time{}}
	m.c = newLeaseClock(func() time.Time { return m.now }, 300*time.Millisecond)
	m.f = newFSM(m)
	keys := []string{"k0", "k1"}
	owners := []string{"o0", "o1", "o2"}
	ttls := []time.Duration{time.Second, 2 * time.Second, 500 * time.Millisecond}
	for step := 0; step < n; step++ {
		key, owner := keys[rng.IntN(len(keys))], owners[rng.IntN(len(owners))]
		ttl := ttls[rng.IntN(len(ttls))]
		switch op := rng.IntN(20); op {
		case 0, 1, 2: // acquire, with or without wait
			c := command{op: opAcquire, key: key, owner: owner, ttl: ttl, wait: op != 0, maxWaiters: 4, maxLeases: 10, maxTotalWaiters: 8}
			if rng.IntN(3) == 0 {
				c.lockDelay = min(ttl, 700*time.Millisecond)
			}
			m.log = append(m.log, modelEntry{c: c, sent: m.now})
		case 3:
			m.log = append(m.log, modelEntry{c: command{op: opRelease, key: key, owner: owner}, sent: m.now})
		case 4:
			m.log = append(m.log, modelEntry{c: command{op: opCancelWait, key: key, owner: owner}, sent: m.now})
		case 5, 6, 7: // a renewal: in memory, or through the log with a new TTL
			// Its time was read a moment before the clock's lock was
			// taken, so it may be earlier than a countdown that fired
			// meanwhile.
			at := m.now.Add(-time.Duration(rng.IntN(200)) * time.Millisecond)
			switch m.c.renew(key, owner, ttl, at) {
			case renewOK:
				m.logf("renew %s/%s %v ok (read at %v)", key, owner, ttl, at.Sub(time.Unix(0, 0)))
				m.valid[keyOwner{key, owner}] = later(m.valid[keyOwner{key, owner}], at.Add(ttl))
			case renewNeedsLog:
				m.logf("renew %s/%s %v via log", key, owner, ttl)
				m.log = append(m.log, modelEntry{c: command{op: opSetTTL, key: key, owner: owner, ttl: ttl}, sent: at, renew: true})
			}
		case 8: // time passes
			m.now = m.now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
		case 9: // a little time passes
			m.now = m.now.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
		case 10, 11: // the leader's countdowns fire: their proposals join the log
			fs, _ := m.c.takeExpired(m.now, 1024)
			for _, f := range fs {
				var c command
				switch f.kind {
				case fireExpire:
					c = command{op: opExpire, expiries: []expiry{f.x}}
				case fireUnclaimed:
					c = command{op: opUnclaimed, expiries: []expiry{f.x}}
				case fireEndDelay:
					c = command{op: opEndDelay, key: f.x.key, version: f.x.version}
				case fireSuspect:
					c = command{op: opSuspect, suspects: []suspectMark{{key: f.x.key, owner: f.x.owner, version: f.x.version, left: f.left}}}
				}
				m.logf("fire %d %v", f.kind, f.x)
				m.log = append(m.log, modelEntry{c: c, sent: m.now, fired: []fired{f}})
			}
		case 12, 13, 14, 15, 16, 17:
			m.applyNext()
		case 19: // now and then a restart: the log is replayed (every
			// proposal reached it), the table maybe restored from a
			// snapshot, and the new leader restarts every countdown
			if rng.IntN(8) != 0 {
				m.applyNext()
				break
			}
			for len(m.log) > 0 {
				m.applyNext()
			}
			if rng.IntN(2) == 0 {
				m.logf("restart from a snapshot")
				snap, err := m.f.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				sink := &memSink{}
				if err := snap.Persist(sink); err != nil {
					t.Fatal(err)
				}
				m.f = newFSM(m)
				if err := m.f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
					t.Fatal(err)
				}
			} else {
				m.logf("restart")
			}
			m.c.restartAll()
		case 18: // the newest proposal of the leader failed before the log
			for i := len(m.log) - 1; i >= 0; i-- {
				if m.log[i].fired != nil {
					m.logf("proposal failed: %v", m.log[i].fired)
					m.c.retry(m.log[i].fired, 100*time.Millisecond)
					m.log = append(m.log[:i], m.log[i+1:]...)
					break
				}
			}
		}
		m.check()
	}
	for len(m.log) > 0 {
		m.applyNext()
	}
	m.check()
	if tr != nil {
		for _, l := range m.trace {
			tr(l)
		}
	}
}

// TestLeaseClock_ModelNeverEndsAValidGrant runs random histories of
// acquisitions, waits, releases, cancels, in-memory and logged renewals,
// expiries, unclaimed releases, lock-delays and failed proposals through
// the FSM and the lease clock together: no grant is ended by expiry or
// unclaimed release before the end of the validity its holder was told,
// and the clock always matches the table.
func TestLeaseClock_ModelNeverEndsAValidGrant(t *testing.T) {
	for seed := range uint64(300) {
		runClockModel(t, seed, 400)
	}
}
