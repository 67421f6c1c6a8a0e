package server

import (
	"bufio"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// opcode names a state machine command.
type opcode byte

const (
	opAcquire    opcode = 1 // grant or queue (key, owner)
	opRelease    opcode = 2 // owner releases key; head waiter granted in the same entry
	opExpire     opcode = 3 // leader expires (key, owner) pairs; acts only where owner still holds
	opCancelWait opcode = 4 // remove owner's queue entry, or release a grant that raced the cancellation
	opSetTTL     opcode = 5 // change the TTL of owner's grant
	opPurge      opcode = 6 // remove queue entries whose clients are gone (new leader)
)

// keyOwner names one grant or one queue entry.
type keyOwner struct{ key, owner string }

// command is one state machine command, carried in one Raft log entry. The
// limits travel in the command so that every replica decides the same way
// whatever its own configuration says.
type command struct {
	op         opcode
	key        string
	owner      string
	holder     string
	session    string
	ttl        time.Duration
	wait       bool
	maxWaiters uint64
	maxLeases  uint64
	pairs      []keyOwner
}

const commandVersion = 1

func (c *command) encode() []byte {
	e := enc{b: make([]byte, 0, 32+len(c.key)+len(c.owner)+len(c.holder)+len(c.session))}
	e.byte1(commandVersion)
	e.byte1(byte(c.op))
	switch c.op {
	case opAcquire:
		e.str(c.key)
		e.str(c.owner)
		e.str(c.holder)
		e.str(c.session)
		e.dur(c.ttl)
		e.boolean(c.wait)
		e.u64(c.maxWaiters)
		e.u64(c.maxLeases)
	case opRelease, opCancelWait:
		e.str(c.key)
		e.str(c.owner)
	case opSetTTL:
		e.str(c.key)
		e.str(c.owner)
		e.dur(c.ttl)
	case opExpire, opPurge:
		e.u64(uint64(len(c.pairs)))
		for _, p := range c.pairs {
			e.str(p.key)
			e.str(p.owner)
		}
	}
	return e.b
}

func decodeCommand(b []byte) (command, error) {
	d := dec{b: b}
	var c command
	if v := d.byte1(); d.err == nil && v != commandVersion {
		return c, errCorrupt
	}
	c.op = opcode(d.byte1())
	switch c.op {
	case opAcquire:
		c.key = d.str()
		c.owner = d.str()
		c.holder = d.str()
		c.session = d.str()
		c.ttl = d.dur()
		c.wait = d.boolean()
		c.maxWaiters = d.u64()
		c.maxLeases = d.u64()
	case opRelease, opCancelWait:
		c.key = d.str()
		c.owner = d.str()
	case opSetTTL:
		c.key = d.str()
		c.owner = d.str()
		c.ttl = d.dur()
	case opExpire, opPurge:
		n := d.u64()
		if n > uint64(len(d.b)) { // each pair takes at least 2 bytes
			return c, errCorrupt
		}
		c.pairs = make([]keyOwner, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			c.pairs = append(c.pairs, keyOwner{key: d.str(), owner: d.str()})
		}
	default:
		return c, errCorrupt
	}
	return c, d.err
}

// resultCode is the outcome of one command.
type resultCode int

const (
	resOK             resultCode = iota // done (release, set TTL, cancel, expire, purge)
	resGranted                          // acquire: granted now (fence set)
	resQueued                           // acquire: queued (position set)
	resHeld                             // acquire: key held, not waiting
	resLost                             // release/set TTL: owner does not hold key
	resTooManyWaiters                   // acquire: the key's queue is full
	resTooManyLeases                    // acquire: the server holds its maximum of leases
	resBadCommand                       // the entry did not decode; nothing changed
)

// applyResult is what Apply returns for one log entry.
type applyResult struct {
	code     resultCode
	fence    uint64 // acquire: the grant's fence; release: fence handed to the next waiter
	position int    // acquire queued: 1-based queue position
	dequeued bool   // cancel: a queue entry was removed
	released bool   // cancel: a raced grant was released
}

// grant is the holder of a key.
type grant struct {
	owner   string
	holder  string
	session string
	fence   uint64
	ttl     time.Duration
}

// waiter is one queue entry.
type waiter struct {
	owner   string
	holder  string
	session string
	ttl     time.Duration
}

// lockEntry is one key of the lock table. An entry exists only while its key
// is held; waiters exist only behind a holder (a release hands the key over
// in the same entry).
type lockEntry struct {
	grant   grant
	waiters []waiter
}

// eventKind is what an applied command did, as told to the server.
type eventKind int

const (
	evGranted  eventKind = iota // key granted to owner (fence, ttl, session set)
	evRemoved                   // owner's grant on key ended (reason set)
	evDequeued                  // owner's queue entry on key removed
	evTTL                       // owner's grant's TTL changed
)

// removeReason says why a grant ended.
type removeReason int

const (
	reasonReleased removeReason = iota
	reasonExpired
	reasonCancelled
)

// event is a change of the lock table, told to the observer after the entry
// is applied. Events do not feed back into the state.
type event struct {
	kind    eventKind
	key     string
	owner   string
	session string
	fence   uint64
	ttl     time.Duration
	reason  removeReason
}

// observer hears of every change of the lock table, in log order, from the
// FSM goroutine, with no FSM lock held. It must not block for long.
type observer interface {
	lockEvents(evs []event)
	// lockReset replaces everything the observer knows: the table was
	// restored from a snapshot.
	lockReset(holders []event)
}

// fsm is the lock table, the replicated state machine. Apply reads no clock,
// no randomness and does no I/O: its result depends only on the log.
type fsm struct {
	obs observer

	mu      sync.RWMutex
	locks   map[string]*lockEntry
	strs    interner // holder and session strings, shared by the grants that use them
	waiting int      // total queue entries
	applied uint64   // index of the last entry applied

	appliedMu   sync.Mutex
	appliedWake chan struct{} // closed and replaced after each batch
}

func newFSM(obs observer) *fsm {
	return &fsm{obs: obs, locks: make(map[string]*lockEntry), strs: newInterner(), appliedWake: make(chan struct{})}
}

// interner shares equal strings (holder texts and sessions repeat across a
// client's grants) with a reference count, so the table does not keep one
// copy per grant. It is part of the FSM, changed only by Apply and Restore.
type interner struct{ m map[string]*internRef }

type internRef struct {
	s string
	n int
}

func newInterner() interner { return interner{m: make(map[string]*internRef)} }

// get returns the shared copy of s and counts one more user.
func (in interner) get(s string) string {
	if s == "" {
		return ""
	}
	r := in.m[s]
	if r == nil {
		r = &internRef{s: s}
		in.m[s] = r
	}
	r.n++
	return r.s
}

// put counts one user less of s.
func (in interner) put(s string) {
	if s == "" {
		return
	}
	if r := in.m[s]; r != nil {
		if r.n--; r.n <= 0 {
			delete(in.m, s)
		}
	}
}

var _ raft.BatchingFSM = (*fsm)(nil)

// Apply applies one entry. See ApplyBatch.
func (f *fsm) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies committed entries in order and returns one
// applyResult per entry (nil for configuration entries).
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	var evs []event
	f.mu.Lock()
	for i, l := range logs {
		if l.Index > f.applied {
			f.applied = l.Index
		}
		if l.Type != raft.LogCommand {
			continue
		}
		c, err := decodeCommand(l.Data)
		if err != nil {
			out[i] = applyResult{code: resBadCommand}
			continue
		}
		var r applyResult
		r, evs = f.apply(l.Index, &c, evs)
		out[i] = r
	}
	f.mu.Unlock()
	if len(evs) > 0 && f.obs != nil {
		f.obs.lockEvents(evs)
	}
	f.appliedMu.Lock()
	close(f.appliedWake)
	f.appliedWake = make(chan struct{})
	f.appliedMu.Unlock()
	return out
}

// appliedIndex returns the last applied index and a channel closed at the
// next applied batch.
func (f *fsm) appliedIndex() (uint64, <-chan struct{}) {
	f.appliedMu.Lock()
	ch := f.appliedWake
	f.appliedMu.Unlock()
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.applied, ch
}

// apply runs one command at log index idx with f.mu held.
func (f *fsm) apply(idx uint64, c *command, evs []event) (applyResult, []event) {
	switch c.op {
	case opAcquire:
		return f.acquire(idx, c, evs)
	case opRelease:
		e := f.locks[c.key]
		if e == nil || e.grant.owner != c.owner {
			return applyResult{code: resLost}, evs
		}
		var next uint64
		next, evs = f.handoff(idx, c.key, e, reasonReleased, evs)
		return applyResult{code: resOK, fence: next}, evs
	case opExpire:
		for _, p := range c.pairs {
			if e := f.locks[p.key]; e != nil && e.grant.owner == p.owner {
				_, evs = f.handoff(idx, p.key, e, reasonExpired, evs)
			}
		}
		return applyResult{code: resOK}, evs
	case opCancelWait:
		return f.cancelWait(idx, c.key, c.owner, true, evs)
	case opPurge:
		for _, p := range c.pairs {
			_, evs = f.cancelWait(idx, p.key, p.owner, false, evs)
		}
		return applyResult{code: resOK}, evs
	case opSetTTL:
		e := f.locks[c.key]
		if e == nil || e.grant.owner != c.owner {
			return applyResult{code: resLost}, evs
		}
		e.grant.ttl = c.ttl
		evs = append(evs, event{kind: evTTL, key: c.key, owner: c.owner, session: e.grant.session, fence: e.grant.fence, ttl: c.ttl})
		return applyResult{code: resOK}, evs
	}
	return applyResult{code: resBadCommand}, evs
}

func (f *fsm) acquire(idx uint64, c *command, evs []event) (applyResult, []event) {
	e := f.locks[c.key]
	if e == nil {
		if uint64(len(f.locks)) >= c.maxLeases {
			return applyResult{code: resTooManyLeases}, evs
		}
		e = &lockEntry{grant: grant{owner: c.owner, holder: f.strs.get(c.holder), session: f.strs.get(c.session), fence: idx, ttl: c.ttl}}
		f.locks[c.key] = e
		evs = append(evs, event{kind: evGranted, key: c.key, owner: c.owner, session: e.grant.session, fence: idx, ttl: c.ttl})
		return applyResult{code: resGranted, fence: idx}, evs
	}
	if e.grant.owner == c.owner { // a retried request: the grant stands
		return applyResult{code: resGranted, fence: e.grant.fence}, evs
	}
	for i, w := range e.waiters {
		if w.owner == c.owner {
			return applyResult{code: resQueued, position: i + 1}, evs
		}
	}
	if !c.wait {
		return applyResult{code: resHeld}, evs
	}
	if uint64(len(e.waiters)) >= c.maxWaiters {
		return applyResult{code: resTooManyWaiters}, evs
	}
	e.waiters = append(e.waiters, waiter{owner: c.owner, holder: f.strs.get(c.holder), session: f.strs.get(c.session), ttl: c.ttl})
	f.waiting++
	return applyResult{code: resQueued, position: len(e.waiters)}, evs
}

// handoff ends the grant of e and grants the head waiter, if any, with fence
// idx. It returns the new fence, or 0 when the key became free.
func (f *fsm) handoff(idx uint64, key string, e *lockEntry, why removeReason, evs []event) (uint64, []event) {
	g := e.grant
	evs = append(evs, event{kind: evRemoved, key: key, owner: g.owner, session: g.session, fence: g.fence, ttl: g.ttl, reason: why})
	f.strs.put(g.holder)
	f.strs.put(g.session)
	if len(e.waiters) == 0 {
		delete(f.locks, key)
		return 0, evs
	}
	w := e.waiters[0]
	e.waiters[0] = waiter{}
	e.waiters = e.waiters[1:]
	if len(e.waiters) == 0 {
		e.waiters = nil
	}
	f.waiting--
	e.grant = grant{owner: w.owner, holder: w.holder, session: w.session, fence: idx, ttl: w.ttl}
	evs = append(evs, event{kind: evGranted, key: key, owner: w.owner, session: w.session, fence: idx, ttl: w.ttl})
	return idx, evs
}

// cancelWait removes owner's queue entry on key; with releaseGrant, it also
// releases owner's grant on key (a grant that raced the cancellation).
func (f *fsm) cancelWait(idx uint64, key, owner string, releaseGrant bool, evs []event) (applyResult, []event) {
	e := f.locks[key]
	if e == nil {
		return applyResult{code: resOK}, evs
	}
	for i, w := range e.waiters {
		if w.owner == owner {
			e.waiters = append(e.waiters[:i:i], e.waiters[i+1:]...)
			if len(e.waiters) == 0 {
				e.waiters = nil
			}
			f.waiting--
			f.strs.put(w.holder)
			f.strs.put(w.session)
			evs = append(evs, event{kind: evDequeued, key: key, owner: owner, session: w.session})
			return applyResult{code: resOK, dequeued: true}, evs
		}
	}
	if releaseGrant && e.grant.owner == owner {
		_, evs = f.handoff(idx, key, e, reasonCancelled, evs)
		return applyResult{code: resOK, released: true}, evs
	}
	return applyResult{code: resOK}, evs
}

// holderView is a read-only copy of one key's state.
type holderView struct {
	key     string
	grant   grant
	waiters int
}

// get returns the state of key.
func (f *fsm) get(key string) (holderView, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	e := f.locks[key]
	if e == nil {
		return holderView{}, false
	}
	return holderView{key: key, grant: e.grant, waiters: len(e.waiters)}, true
}

// list returns up to limit held keys starting with prefix, sorted.
func (f *fsm) list(prefix string, limit int) []holderView {
	f.mu.RLock()
	out := make([]holderView, 0, min(limit, 64))
	keys := make([]string, 0, 64)
	for k := range f.locks {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(keys) > limit {
		keys = keys[:limit]
	}
	for _, k := range keys {
		e := f.locks[k]
		out = append(out, holderView{key: k, grant: e.grant, waiters: len(e.waiters)})
	}
	f.mu.RUnlock()
	return out
}

// queued returns every queue entry.
func (f *fsm) queued() []keyOwner {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []keyOwner
	for k, e := range f.locks {
		for _, w := range e.waiters {
			out = append(out, keyOwner{key: k, owner: w.owner})
		}
	}
	return out
}

// counts returns the number of held keys and of queue entries.
func (f *fsm) counts() (held, waiting int) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.locks), f.waiting
}

// holders returns one evGranted event per held key, describing its grant.
func (f *fsm) holders() []event {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return holdersLocked(f.locks)
}

func holdersLocked(locks map[string]*lockEntry) []event {
	out := make([]event, 0, len(locks))
	for k, e := range locks {
		out = append(out, event{kind: evGranted, key: k, owner: e.grant.owner, session: e.grant.session, fence: e.grant.fence, ttl: e.grant.ttl})
	}
	return out
}

// Snapshot copies the table; Persist writes it without holding the lock.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := &fsmSnapshot{entries: make([]snapEntry, 0, len(f.locks))}
	for k, e := range f.locks {
		s.entries = append(s.entries, snapEntry{key: k, grant: e.grant, waiters: append([]waiter(nil), e.waiters...)})
	}
	return s, nil
}

const snapshotMagic = "dlockd-snap-v1"

type snapEntry struct {
	key     string
	grant   grant
	waiters []waiter
}

type fsmSnapshot struct{ entries []snapEntry }

// Persist writes the table: magic, count, then per key its grant and queue.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	w := bufio.NewWriterSize(sink, 1<<16)
	e := enc{b: make([]byte, 0, 4096)}
	e.str(snapshotMagic)
	e.u64(uint64(len(s.entries)))
	for _, en := range s.entries {
		e.str(en.key)
		e.str(en.grant.owner)
		e.str(en.grant.holder)
		e.str(en.grant.session)
		e.u64(en.grant.fence)
		e.dur(en.grant.ttl)
		e.u64(uint64(len(en.waiters)))
		for _, wt := range en.waiters {
			e.str(wt.owner)
			e.str(wt.holder)
			e.str(wt.session)
			e.dur(wt.ttl)
		}
		if len(e.b) > 1<<15 {
			if _, err := w.Write(e.b); err != nil {
				_ = sink.Cancel()
				return err
			}
			e.b = e.b[:0]
		}
	}
	if _, err := w.Write(e.b); err != nil {
		_ = sink.Cancel()
		return err
	}
	if err := w.Flush(); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

// Release does nothing: the snapshot holds only copies.
func (s *fsmSnapshot) Release() {}

// Restore replaces the table with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	locks, strs, waiting, err := decodeSnapshot(data)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.locks = locks
	f.strs = strs
	f.waiting = waiting
	hs := holdersLocked(locks)
	f.mu.Unlock()
	if f.obs != nil {
		f.obs.lockReset(hs)
	}
	return nil
}

func decodeSnapshot(data []byte) (map[string]*lockEntry, interner, int, error) {
	d := dec{b: data}
	strs := newInterner()
	if d.str() != snapshotMagic || d.err != nil {
		return nil, strs, 0, errCorrupt
	}
	n := d.u64()
	if n > uint64(len(d.b)) {
		return nil, strs, 0, errCorrupt
	}
	locks := make(map[string]*lockEntry, n)
	waiting := 0
	for i := uint64(0); i < n && d.err == nil; i++ {
		key := d.str()
		e := &lockEntry{grant: grant{owner: d.str(), holder: strs.get(d.str()), session: strs.get(d.str()), fence: d.u64(), ttl: d.dur()}}
		nw := d.u64()
		if nw > uint64(len(d.b)) {
			return nil, strs, 0, errCorrupt
		}
		for j := uint64(0); j < nw && d.err == nil; j++ {
			e.waiters = append(e.waiters, waiter{owner: d.str(), holder: strs.get(d.str()), session: strs.get(d.str()), ttl: d.dur()})
		}
		waiting += len(e.waiters)
		locks[key] = e
	}
	if d.err != nil {
		return nil, strs, 0, d.err
	}
	return locks, strs, waiting, nil
}
