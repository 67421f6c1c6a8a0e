package server

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// opcode names a state machine command.
type opcode byte

const (
	opAcquire      opcode = 1  // grant or queue (key, owner); a retry by the holder renews through the log
	opRelease      opcode = 2  // owner releases key; head waiter granted in the same entry
	opExpire       opcode = 3  // leader expires grants; acts only on the grant version it saw run out
	opCancelWait   opcode = 4  // remove owner's queue entry, or release a grant that raced the cancellation
	opSetTTL       opcode = 5  // change the TTL of owner's grant (and restart its countdown)
	opPurge        opcode = 6  // remove queue entries whose clients are gone (new leader)
	opUnclaimed    opcode = 7  // leader releases handed-over grants their receivers did not claim in time
	opForceRelease opcode = 8  // an operator removes key's grant whoever holds it
	opEndDelay     opcode = 9  // the key's lock-delay has run out: hand it to the head waiter, or free it
	opNoop         opcode = 10 // changes nothing: a new leader's first entry seen by the FSM (see readBarrier)
	opSetMember    opcode = 11 // members registry: set node key's API address (holder) and incarnation (session)
	opRemoveMember opcode = 12 // members registry: remove node key
	opSuspect      opcode = 13 // leader logs the time left of grants unrenewed for part of their TTL (suspect leases)
	opPurgeIdle    opcode = 14 // new leader removes queue entries not re-attached within their grace
	// opEndSharedDelay: the lock-delay of a lost Shared grant (its permit
	// stays taken meanwhile) has run out: free the permit (shared.go).
	opEndSharedDelay opcode = 15
	// opBatch: an entry of encoding version 4 carrying several commands,
	// applied in order at the entry's index (propose.go, encodeBatch).
	opBatch opcode = 16
)

// keyOwner names one grant or one queue entry.
type keyOwner struct{ key, owner string }

// expiry names one grant version that a leader's countdown saw run out.
// version is the index of the entry that last set the grant's countdown
// (its grant, a TTL change, a retried acquire); an expiry of an older
// version is stale (a renewal through the log overtook it) and does nothing.
// Version 0 (entries written before versions existed) matches any version.
type expiry struct {
	key, owner string
	version    uint64
}

// suspectMark is one grant version a leader marked suspect, with the time
// its countdown had left when marked (or at a later checkpoint).
type suspectMark struct {
	key, owner string
	version    uint64
	left       time.Duration
}

// idleEntry names one queue entry by the index that last attached it
// (queued it, or re-attached its owner); opPurgeIdle removes it only if no
// later acquisition re-attached it.
type idleEntry struct {
	key, owner string
	since      uint64
}

// command is one state machine command, carried in one Raft log entry. The
// limits travel in the command so that every replica decides the same way
// whatever its own configuration says.
type command struct {
	op              opcode
	key             string
	owner           string
	holder          string
	session         string
	ttl             time.Duration
	lockDelay       time.Duration // acquire: lock-delay after a loss of this grant
	wait            bool
	maxWaiters      uint64 // acquire: per key
	maxLeases       uint64 // acquire: held keys of the server
	maxTotalWaiters uint64 // acquire: queue entries of the server (0: no limit, entries of version 1)
	version         uint64 // end delay: the delay's version
	pairs           []keyOwner
	expiries        []expiry
	suspects        []suspectMark // opSuspect
	idle            []idleEntry   // opPurgeIdle
	// shared, limit: acquire of a Shared grant (a permit of a semaphore of
	// limit permits, or a reader when limit is 0); entries of version 3.
	shared bool
	limit  uint64
}

// commandVersion 2 added lock-delays, the total-waiters limit and grant
// versions in expiries; entries of version 1 still decode. Version 3 adds
// Shared acquisitions (shared, limit) and opEndSharedDelay; every other
// command is still written at version 2, byte for byte as before, so that
// plain locks need no upgrade of the members that read them.
const commandVersion = 3

// encVersion returns the encoding version c needs.
func (c *command) encVersion() byte {
	if (c.op == opAcquire && c.shared) || c.op == opEndSharedDelay {
		return 3
	}
	return 2
}

func (c *command) encode() []byte {
	e := enc{b: make([]byte, 0, 40+len(c.key)+len(c.owner)+len(c.holder)+len(c.session))}
	v := c.encVersion()
	e.byte1(v)
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
		e.dur(c.lockDelay)
		e.u64(c.maxTotalWaiters)
		if v >= 3 {
			e.boolean(c.shared)
			e.u64(c.limit)
		}
	case opEndSharedDelay:
		e.str(c.key)
		e.str(c.owner)
		e.u64(c.version)
	case opRelease, opCancelWait:
		e.str(c.key)
		e.str(c.owner)
	case opSetTTL:
		e.str(c.key)
		e.str(c.owner)
		e.dur(c.ttl)
	case opForceRelease:
		e.str(c.key)
	case opEndDelay:
		e.str(c.key)
		e.u64(c.version)
	case opNoop:
	case opSetMember, opRemoveMember:
		e.str(c.key)
		e.str(c.holder)
		e.str(c.session)
	case opPurge:
		e.u64(uint64(len(c.pairs)))
		for _, p := range c.pairs {
			e.str(p.key)
			e.str(p.owner)
		}
	case opExpire, opUnclaimed:
		e.u64(uint64(len(c.expiries)))
		for _, x := range c.expiries {
			e.str(x.key)
			e.str(x.owner)
			e.u64(x.version)
		}
	case opSuspect:
		e.u64(uint64(len(c.suspects)))
		for _, x := range c.suspects {
			e.str(x.key)
			e.str(x.owner)
			e.u64(x.version)
			e.dur(x.left)
		}
	case opPurgeIdle:
		e.u64(uint64(len(c.idle)))
		for _, x := range c.idle {
			e.str(x.key)
			e.str(x.owner)
			e.u64(x.since)
		}
	}
	return e.b
}

// batchVersion is the encoding version of a batch entry: the version byte,
// opBatch, the number of commands n (at least 1), then n times the length
// and bytes of one command's plain encoding (versions 1 to 3; never a batch
// in a batch). Nothing follows the last command. A single command is never
// written as a batch: its entry stays byte for byte as before batching.
const batchVersion = 4

// maxBatchCommands bounds the commands of one batch entry (the proposal
// batcher writes at most maxBatchCount).
const maxBatchCommands = 1 << 16

// encodeBatch returns the entry that carries cs in order: the plain
// encoding of cs[0] when it is alone, otherwise a batch entry.
func encodeBatch(cs []*command) []byte {
	subs := make([][]byte, len(cs))
	for i, c := range cs {
		subs[i] = c.encode()
	}
	return batchEntry(subs)
}

// batchEntry returns the entry that carries the encoded commands subs in
// order: subs[0] itself when it is alone, otherwise a batch entry.
func batchEntry(subs [][]byte) []byte {
	if len(subs) == 1 {
		return subs[0]
	}
	n := 12
	for _, sub := range subs {
		n += len(sub) + 3
	}
	e := enc{b: make([]byte, 0, n)}
	e.byte1(batchVersion)
	e.byte1(byte(opBatch))
	e.u64(uint64(len(subs)))
	for _, sub := range subs {
		e.u64(uint64(len(sub)))
		e.b = append(e.b, sub...)
	}
	return e.b
}

// isBatch reports whether the entry data b is a batch entry (it may still
// be corrupt).
func isBatch(b []byte) bool { return len(b) > 0 && b[0] == batchVersion }

// decodeBatch decodes a batch entry into its commands, or returns
// errCorrupt: a bad header, a count of 0 or above maxBatchCommands or
// above what the bytes can hold, a command that does not decode (a batch
// in the batch among them), or bytes after the last command. It never
// returns part of a batch.
func decodeBatch(b []byte) ([]command, error) { return decodeBatchInto(b, nil) }

// decodeBatchInto is decodeBatch, decoding into buf's array when it has
// room for the entry's commands.
func decodeBatchInto(b []byte, buf []command) ([]command, error) {
	d := dec{b: b}
	if d.byte1() != batchVersion || opcode(d.byte1()) != opBatch {
		return nil, errCorrupt
	}
	n := d.u64()
	if d.err != nil || n == 0 || n > maxBatchCommands || n > uint64(len(d.b))/3 { // each command takes a length and at least 2 bytes
		return nil, errCorrupt
	}
	cs := buf[:0]
	if uint64(cap(cs)) < n {
		cs = make([]command, 0, n)
	}
	for i := uint64(0); i < n; i++ {
		l := d.u64()
		if d.err != nil || l > uint64(len(d.b)) {
			return nil, errCorrupt
		}
		c, err := decodeCommand(d.b[:l])
		if err != nil {
			return nil, errCorrupt
		}
		d.b = d.b[l:]
		cs = append(cs, c)
	}
	if len(d.b) != 0 {
		return nil, errCorrupt
	}
	return cs, nil
}

func decodeCommand(b []byte) (command, error) {
	d := dec{b: b}
	var c command
	v := d.byte1()
	if d.err == nil && (v < 1 || v > commandVersion) {
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
		if v >= 2 {
			c.lockDelay = d.dur()
			c.maxTotalWaiters = d.u64()
		}
		if v >= 3 {
			c.shared = d.boolean()
			c.limit = d.u64()
			if !c.shared && c.limit != 0 {
				return c, errCorrupt
			}
		}
	case opEndSharedDelay:
		if v < 3 {
			return c, errCorrupt
		}
		c.key = d.str()
		c.owner = d.str()
		c.version = d.u64()
	case opRelease, opCancelWait:
		c.key = d.str()
		c.owner = d.str()
	case opSetTTL:
		c.key = d.str()
		c.owner = d.str()
		c.ttl = d.dur()
	case opForceRelease:
		if v < 2 {
			return c, errCorrupt
		}
		c.key = d.str()
	case opEndDelay:
		if v < 2 {
			return c, errCorrupt
		}
		c.key = d.str()
		c.version = d.u64()
	case opNoop:
		if v < 2 {
			return c, errCorrupt
		}
	case opSetMember, opRemoveMember:
		c.key = d.str()
		c.holder = d.str()
		c.session = d.str()
	case opPurge:
		n := d.u64()
		if n > uint64(len(d.b)) { // each pair takes at least 2 bytes
			return c, errCorrupt
		}
		c.pairs = make([]keyOwner, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			c.pairs = append(c.pairs, keyOwner{key: d.str(), owner: d.str()})
		}
	case opExpire, opUnclaimed:
		if c.op == opUnclaimed && v < 2 {
			return c, errCorrupt
		}
		n := d.u64()
		if n > uint64(len(d.b)) {
			return c, errCorrupt
		}
		c.expiries = make([]expiry, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			x := expiry{key: d.str(), owner: d.str()}
			if v >= 2 {
				x.version = d.u64()
			}
			c.expiries = append(c.expiries, x)
		}
	case opSuspect:
		n := d.u64()
		if v < 2 || n > uint64(len(d.b)) {
			return c, errCorrupt
		}
		c.suspects = make([]suspectMark, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			c.suspects = append(c.suspects, suspectMark{key: d.str(), owner: d.str(), version: d.u64(), left: d.dur()})
		}
	case opPurgeIdle:
		n := d.u64()
		if v < 2 || n > uint64(len(d.b)) {
			return c, errCorrupt
		}
		c.idle = make([]idleEntry, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			c.idle = append(c.idle, idleEntry{key: d.str(), owner: d.str(), since: d.u64()})
		}
	default:
		return c, errCorrupt
	}
	return c, d.err
}

// resultCode is the outcome of one command.
type resultCode int

const (
	resOK             resultCode = iota // done (release, set TTL, cancel, expire, purge, force release)
	resGranted                          // acquire: granted now (fence set), or renewed by its holder's retry
	resQueued                           // acquire: queued (position set)
	resHeld                             // acquire: key held, not waiting
	resLost                             // release/set TTL: owner does not hold key; force release: key not held
	resTooManyWaiters                   // acquire: the key's queue is full
	resTooManyLeases                    // acquire: the server holds its maximum of leases
	resBadCommand                       // the entry did not decode; nothing changed
	resDelayed                          // acquire: key in its lock-delay, not waiting
	resTooManyQueued                    // acquire: the server holds its maximum of queue entries
	resBadLimit                         // acquire (Shared): the key's permit limit differs (applyResult.limit)
)

// applyResult is what Apply returns for one log entry.
type applyResult struct {
	code     resultCode
	fence    uint64        // acquire: the grant's fence; release, force release: fence handed to the next waiter
	ttl      time.Duration // acquire granted: the TTL the countdown runs with
	position int           // acquire queued: 1-based queue position
	dequeued bool          // cancel: a queue entry was removed
	released bool          // cancel: a raced grant was released
	removed  grant         // force release: the grant removed (a Shared key: its oldest grant)
	limit    int           // resBadLimit: the key's permit limit
	nremoved int           // force release: the grants removed (a Shared key may have many)
}

// batchResult is what Apply returns for a batch entry: one applyResult
// per command, in the entry's order.
type batchResult []applyResult

// grant is the holder of a key.
type grant struct {
	owner string
	// p is the client's holder text and session, shared by its grants
	// and queue entries (interner): read them with holder and session.
	p         *party
	fence     uint64
	ttl       time.Duration
	lockDelay time.Duration // the key's lock-delay after a loss of this grant
	version   uint64        // index of the entry that last set the countdown (grant, TTL change, retry)
	// restartTTL is the longest TTL the grant ever had: a new leader
	// restarts the countdown with it, so a renewal that shortened the TTL
	// never brings an end the holder was acknowledged before.
	restartTTL time.Duration
	// suspect: a leader logged (opSuspect, for this version) that the
	// grant went unrenewed for part of its TTL, with suspectLeft, the time
	// its countdown had left then. A new leader restarts the countdown at
	// suspectLeft instead of restartTTL. Cleared by the next version.
	// (suspect is declared last, beside delayed: the two bools share a
	// word, which keeps a grant at 80 bytes and a lockEntry at 96.)
	suspectLeft time.Duration
	// delayed, for a Shared grant only: the grant was lost without a
	// release (expiry, claim window) and its lock-delay runs, from
	// version (the entry that ended it) for lockDelay: its permit stays
	// taken and no Exclusive grant is made, so that the lost holder's
	// in-flight writes land first. Holder and session are cleared.
	delayed bool
	suspect bool
}

// waiter is one queue entry.
type waiter struct {
	owner     string
	p         *party // holder text and session, as grant.p
	ttl       time.Duration
	lockDelay time.Duration
	// since is the index of the entry that queued the owner or last
	// re-attached it (an acquisition with wait of the queued owner): a new
	// leader's purge of entries whose grace ran out names it, and a later
	// re-attachment makes that purge miss.
	since uint64
	// shared: the entry waits for a Shared grant (of the key's limit);
	// otherwise for the Exclusive grant.
	shared bool
}

// waitNode is one queue entry in its key's doubly linked queue.
type waitNode struct {
	waiter
	prev, next *waitNode
}

// waitQueue is a key's FIFO queue: a doubly linked list with an index by
// owner, so that enqueue, dequeue of the head and cancel of any entry are
// O(1) however long the queue is.
type waitQueue struct {
	head, tail *waitNode
	byOwner    map[string]*waitNode
}

func (q *waitQueue) len() int { return len(q.byOwner) }

func (q *waitQueue) find(owner string) *waitNode { return q.byOwner[owner] }

func (q *waitQueue) push(w waiter) {
	n := &waitNode{waiter: w, prev: q.tail}
	if q.tail != nil {
		q.tail.next = n
	} else {
		q.head = n
	}
	q.tail = n
	if q.byOwner == nil {
		q.byOwner = make(map[string]*waitNode)
	}
	q.byOwner[w.owner] = n
}

func (q *waitQueue) remove(n *waitNode) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		q.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		q.tail = n.prev
	}
	n.prev, n.next = nil, nil
	delete(q.byOwner, n.owner)
	if len(q.byOwner) == 0 {
		q.byOwner = nil
	}
}

// position returns n's 1-based place, walking from the head: O(n), used
// only to answer a client that asks again while queued.
func (q *waitQueue) position(n *waitNode) int {
	p := 1
	for x := q.head; x != nil && x != n; x = x.next {
		p++
	}
	return p
}

// each calls f for every entry in queue order.
func (q *waitQueue) each(f func(w *waiter)) {
	for x := q.head; x != nil; x = x.next {
		f(&x.waiter)
	}
}

// lockEntry is one key of the lock table. An entry exists while its key is
// held, or while its key is in a lock-delay (held by nobody, granted to
// nobody until opEndDelay); waiters exist only behind one of these (a release
// hands the key over in the same entry).
//
// It is kept small (one 96-byte allocation per held key): what only a key
// with waiters, Shared grants or a lock-delay needs lives in entryExtra,
// which every other entry shares read-only (noExtra, see own).
type lockEntry struct {
	grant grant // valid when held
	held  bool
	*entryExtra
}

// entryExtra is the part of a lockEntry that a plain held key does not
// use. An entry points at noExtra, shared by all of them and never written,
// until a write needs its own (lockEntry.own); trim gives it back once it
// is empty again. Reads need no check: noExtra reads as an empty queue, no
// Shared grants and no lock-delay.
type entryExtra struct {
	delay        time.Duration // when !held: the lock-delay that runs
	delayVersion uint64        // when !held: index of the entry that started the lock-delay
	q            waitQueue
	// shared holds the key's Shared grants by owner (nil when none): an
	// entry holds either the Exclusive grant (held), or Shared grants, or
	// runs a lock-delay, never two of these at once. See shared.go.
	shared map[string]*grant
	// limit is the key's permit limit (0: any number of Shared grants),
	// meaningful while it has Shared grants or Shared waiters.
	limit int
	// nsw counts the Shared entries of q.
	nsw int
}

// noExtra is the entryExtra of every entry that has no queue, no Shared
// grant and no lock-delay. Nothing writes to it (check verifies).
var noExtra = &entryExtra{}

// newLockEntry returns an empty entry.
func newLockEntry() *lockEntry { return &lockEntry{entryExtra: noExtra} }

// own returns e's own entryExtra, made on first use: call it before any
// write to delay, delayVersion, q, shared, limit or nsw.
func (e *lockEntry) own() *entryExtra {
	if e.entryExtra == noExtra {
		e.entryExtra = &entryExtra{}
	}
	return e.entryExtra
}

// trim gives back e's own entryExtra when it holds nothing.
func (e *lockEntry) trim() {
	if x := e.entryExtra; x != noExtra && x.empty() {
		e.entryExtra = noExtra
	}
}

func (x *entryExtra) empty() bool {
	return x.delay == 0 && x.delayVersion == 0 && x.q.head == nil && x.q.byOwner == nil && len(x.shared) == 0 && x.limit == 0 && x.nsw == 0
}

// eventKind is what an applied command did, as told to the server.
type eventKind int

const (
	evGranted    eventKind = iota // key granted to owner (fence, ttl, version, session, handoff set)
	evRemoved                     // owner's grant on key ended (reason set)
	evDequeued                    // owner's queue entry on key removed
	evTTL                         // owner's grant's countdown restarts with ttl (version set)
	evDelayed                     // key entered a lock-delay (ttl = the delay, version set)
	evDelayEnded                  // key's lock-delay ended (a grant or nothing follows)
	evSuspect                     // owner's grant (version set) logged suspect, ttl = the time it had left
	evQueued                      // owner's new queue entry on key (version set; a re-attachment is none): the dashboard's wait times
)

// removeReason says why a grant ended.
type removeReason int

const (
	reasonReleased  removeReason = iota
	reasonExpired                // its countdown ran out
	reasonCancelled              // its waiter gave up as the grant raced in
	reasonForced                 // an operator force-released it
	reasonUnclaimed              // handed over, but not claimed within the claim window
)

// String returns the reason as the API spells it.
func (r removeReason) String() string {
	switch r {
	case reasonReleased:
		return "RELEASED"
	case reasonExpired:
		return "EXPIRED"
	case reasonCancelled:
		return "CANCELLED"
	case reasonForced:
		return "FORCE_RELEASED"
	case reasonUnclaimed:
		return "UNCLAIMED"
	}
	return "UNKNOWN"
}

// event is a change of the lock table, told to the observer after the entry
// is applied. Events do not feed back into the state.
type event struct {
	kind    eventKind
	key     string
	owner   string
	session string
	holder  string
	fence   uint64
	ttl     time.Duration
	// restartTTL: evGranted, evTTL: the TTL a restarted countdown runs
	// with (the grant's longest; see grant.restartTTL).
	restartTTL time.Duration
	version    uint64
	handoff    bool // evGranted: granted to a queued waiter (it must claim the grant)
	reason     removeReason
	// suspect, left: evGranted of a reset state: the grant is logged
	// suspect with left, the time it had left.
	suspect bool
	left    time.Duration
	// shared: the event is about a Shared grant (evGranted, evRemoved,
	// evTTL, evSuspect), or the lock-delay of one lost Shared grant
	// (evDelayed, evDelayEnded: owner set), not about the key as a whole.
	shared bool
}

// observer hears of every change of the lock table, in log order, from the
// FSM goroutine, with no FSM lock held. It must not block for long.
type observer interface {
	lockEvents(evs []event)
	// lockReset replaces everything the observer knows: the table was
	// restored from a snapshot. state holds one evGranted per held key and
	// one evDelayed per key in a lock-delay.
	lockReset(state []event)
	// undecodable is told of a committed command entry the FSM could not
	// decode (skipped, so this member's table no longer matches the log's:
	// an entry written by a newer dlockd, or corruption), once per entry,
	// outside the FSM's lock.
	undecodable(index uint64, err error)
}

// fsm is the lock table, the replicated state machine. Apply reads no clock,
// no randomness and does no I/O: its result depends only on the log.
type fsm struct {
	obs observer

	mu      sync.RWMutex
	locks   lockTable // entries by key, in key order (table.go)
	strs    interner  // holder and session strings, shared by the grants that use them
	waiting int       // total queue entries
	applied uint64    // index of the last entry applied
	// lastFence is the greatest fence issued: a grant's fence is
	// max(index, lastFence+1) (shared.go's nextFence), so that several
	// grants made by one entry get distinct, increasing fences.
	lastFence uint64
	// beforeBatches (tests only) makes this FSM read the log as a dlockd
	// from before batched entries did: a batch entry does not decode.
	beforeBatches atomic.Bool
	// nshared counts the Shared grants (lost ones in their lock-delay
	// included), sharedKeys the entries that have some: the server's
	// lease count is len(locks) - sharedKeys + nshared.
	nshared, sharedKeys int
	members             map[string]member // members registry: node ID -> API address (see cluster.go)

	appliedMu   sync.Mutex
	appliedWake chan struct{} // closed and replaced after each batch

	// applyMu serialises ApplyBatch calls (Raft makes them from one
	// goroutine; tests may not) for its scratch buffers: the commands a
	// batch entry decodes to and the events of a batch, reused from one
	// call to the next (while at most maxScratch long) instead of
	// allocated per entry. Nothing keeps a pointer into them: commands are
	// read by apply, events copied by every observer that keeps one.
	applyMu sync.Mutex
	cmdBuf  []command
	evBuf   []event
}

// maxScratch bounds the scratch buffers an FSM keeps between batches.
const maxScratch = 1024

// scratch returns buf emptied for reuse, or nil when it grew past
// maxScratch (a burst's buffer is not kept).
func scratch[T any](buf []T) []T {
	if cap(buf) > maxScratch {
		return nil
	}
	return buf[:0]
}

func newFSM(obs observer) *fsm {
	return &fsm{obs: obs, members: make(map[string]member), locks: newLockTable(), strs: newInterner(), appliedWake: make(chan struct{})}
}

// party is a client's holder text and session, which repeat across its
// grants and queue entries: the table keeps one copy, counted (interner).
type party struct {
	holder, session string
	n               int // the grants and queue entries that use it
}

// holder returns the grant's holder text ("" when none).
func (g *grant) holder() string { return g.p.holderText() }

// session returns the grant's session ("" when none).
func (g *grant) session() string { return g.p.sessionID() }

// holder returns the queue entry's holder text ("" when none).
func (w *waiter) holder() string { return w.p.holderText() }

// session returns the queue entry's session ("" when none).
func (w *waiter) session() string { return w.p.sessionID() }

func (p *party) holderText() string {
	if p == nil {
		return ""
	}
	return p.holder
}

func (p *party) sessionID() string {
	if p == nil {
		return ""
	}
	return p.session
}

// interner shares equal (holder, session) pairs (a client's repeat across
// its grants) with a reference count, so the table does not keep one copy
// per grant, and a grant points at its pair with one word instead of two
// strings. It is part of the FSM, changed only by Apply and Restore.
type interner struct{ m map[partyKey]*party }

type partyKey struct{ holder, session string }

func newInterner() interner { return interner{m: make(map[partyKey]*party)} }

// get returns the shared pair (holder, session), nil when both are empty,
// and counts one more user.
func (in interner) get(holder, session string) *party {
	if holder == "" && session == "" {
		return nil
	}
	k := partyKey{holder, session}
	p := in.m[k]
	if p == nil {
		p = &party{holder: holder, session: session}
		in.m[k] = p
	}
	p.n++
	return p
}

// put counts one user less of p.
func (in interner) put(p *party) {
	if p == nil {
		return
	}
	if p.n--; p.n <= 0 {
		delete(in.m, partyKey{p.holder, p.session})
	}
}

var _ raft.BatchingFSM = (*fsm)(nil)

// Apply applies one entry. See ApplyBatch.
func (f *fsm) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies committed entries in order and returns one
// applyResult per entry, a batchResult for a batch entry (nil for
// configuration entries).
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	out := make([]interface{}, len(logs))
	evs := f.evBuf[:0]
	var bad []badEntry
	f.mu.Lock()
	for i, l := range logs {
		if l.Index > f.applied {
			f.applied = l.Index
		}
		if l.Type != raft.LogCommand {
			continue
		}
		if isBatch(l.Data) {
			// Every command of the entry runs at its index, in order;
			// each caller gets its own result (propose.go). The batch
			// decodes whole before any command runs.
			cs, err := f.decodeBatchEntry(l.Data)
			if err != nil {
				out[i] = applyResult{code: resBadCommand}
				bad = append(bad, badEntry{l.Index, err})
				continue
			}
			rs := make(batchResult, len(cs))
			for j := range cs {
				rs[j], evs = f.apply(l.Index, &cs[j], evs)
			}
			out[i] = rs
			clear(cs) // no strings kept alive until the next batch
			f.cmdBuf = scratch(cs)
			continue
		}
		c, err := decodeCommand(l.Data)
		if err != nil {
			out[i] = applyResult{code: resBadCommand}
			bad = append(bad, badEntry{l.Index, err})
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
	clear(evs)
	f.evBuf = scratch(evs)
	if f.obs != nil {
		for _, b := range bad {
			f.obs.undecodable(b.index, b.err)
		}
	}
	f.appliedMu.Lock()
	close(f.appliedWake)
	f.appliedWake = make(chan struct{})
	f.appliedMu.Unlock()
	return out
}

// decodeBatchEntry is decodeBatch, but errCorrupt for every batch on an
// FSM that reads the log as before batched entries (beforeBatches, tests).
func (f *fsm) decodeBatchEntry(b []byte) ([]command, error) {
	if f.beforeBatches.Load() {
		return nil, errCorrupt
	}
	return decodeBatchInto(b, f.cmdBuf)
}

// badEntry is a committed command entry that did not decode.
type badEntry struct {
	index uint64
	err   error
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
		e := f.locks.get(c.key)
		if g := liveShared(e, c.owner); g != nil {
			var next uint64
			next, evs = f.endShared(idx, c.key, e, g, reasonReleased, evs)
			return applyResult{code: resOK, fence: next}, evs
		}
		if e == nil || !e.held || e.grant.owner != c.owner {
			return applyResult{code: resLost}, evs
		}
		var next uint64
		next, evs = f.endGrant(idx, c.key, e, reasonReleased, evs)
		return applyResult{code: resOK, fence: next}, evs
	case opExpire, opUnclaimed:
		why := reasonExpired
		if c.op == opUnclaimed {
			why = reasonUnclaimed
		}
		for _, x := range c.expiries {
			e := f.locks.get(x.key)
			if e != nil && e.held && e.grant.owner == x.owner && (x.version == 0 || x.version == e.grant.version) {
				_, evs = f.endGrant(idx, x.key, e, why, evs)
			} else if g := liveShared(e, x.owner); g != nil && (x.version == 0 || x.version == g.version) {
				_, evs = f.endShared(idx, x.key, e, g, why, evs)
			}
		}
		return applyResult{code: resOK}, evs
	case opForceRelease:
		e := f.locks.get(c.key)
		if e != nil && len(e.shared) > 0 {
			return f.forceReleaseShared(idx, c.key, e, evs)
		}
		if e == nil || !e.held {
			return applyResult{code: resLost}, evs
		}
		g := e.grant
		var next uint64
		next, evs = f.endGrant(idx, c.key, e, reasonForced, evs)
		return applyResult{code: resOK, fence: next, removed: g, nremoved: 1}, evs
	case opEndDelay:
		e := f.locks.get(c.key)
		if e == nil || e.held || e.delayVersion == 0 || e.delayVersion != c.version {
			return applyResult{code: resOK}, evs
		}
		evs = append(evs, event{kind: evDelayEnded, key: c.key, version: c.version})
		e.delay, e.delayVersion = 0, 0 // e.delayVersion != 0: e has its own entryExtra
		var next uint64
		next, evs = f.grantNext(idx, c.key, e, evs)
		return applyResult{code: resOK, fence: next}, evs
	case opEndSharedDelay:
		return f.endSharedDelay(idx, c, evs)
	case opNoop:
		return applyResult{code: resOK}, evs
	case opSetMember, opRemoveMember:
		f.applyMember(c)
		return applyResult{code: resOK}, evs
	case opCancelWait:
		return f.cancelWait(idx, c.key, c.owner, true, evs)
	case opPurge:
		for _, p := range c.pairs {
			_, evs = f.cancelWait(idx, p.key, p.owner, false, evs)
		}
		return applyResult{code: resOK}, evs
	case opPurgeIdle:
		for _, p := range c.idle {
			if e := f.locks.get(p.key); e != nil {
				if n := e.q.find(p.owner); n != nil && n.since == p.since {
					_, evs = f.cancelWait(idx, p.key, p.owner, false, evs)
				}
			}
		}
		return applyResult{code: resOK}, evs
	case opSuspect:
		// Only for the version the leader saw: a logged renewal since
		// (a new version) makes the mark stale. The version does not
		// change, so an expiry proposed for it stays valid.
		for _, x := range c.suspects {
			e := f.locks.get(x.key)
			var g *grant
			if e != nil && e.held && e.grant.owner == x.owner {
				g = &e.grant
			} else {
				g = liveShared(e, x.owner)
			}
			if g != nil && x.version != 0 && x.version == g.version && x.left > 0 {
				g.suspect, g.suspectLeft = true, x.left
				evs = append(evs, event{kind: evSuspect, key: x.key, owner: x.owner, session: g.session(), fence: g.fence, ttl: x.left, version: x.version, shared: g != &e.grant})
			}
		}
		return applyResult{code: resOK}, evs
	case opSetTTL:
		e := f.locks.get(c.key)
		g := liveShared(e, c.owner)
		if g == nil {
			if e == nil || !e.held || e.grant.owner != c.owner {
				return applyResult{code: resLost}, evs
			}
			g = &e.grant
		}
		ttl := c.ttl
		if ttl == 0 { // a renewal of a suspect grant through the log: same TTL
			ttl = g.ttl
		}
		evs = restartGrant(idx, c.key, g, g != &e.grant, ttl, evs)
		return applyResult{code: resOK, ttl: ttl}, evs
	}
	return applyResult{code: resBadCommand}, evs
}

// restartGrant sets the TTL of grant g (the key's Exclusive grant, or one
// of its Shared grants) and makes idx its version: every node restarts the
// countdown with ttl, and expiries proposed for an earlier version become
// stale.
func restartGrant(idx uint64, key string, g *grant, shared bool, ttl time.Duration, evs []event) []event {
	g.ttl = ttl
	g.restartTTL = max(g.restartTTL, ttl)
	g.version = idx
	g.suspect, g.suspectLeft = false, 0
	return append(evs, event{kind: evTTL, key: key, owner: g.owner, session: g.session(), fence: g.fence, ttl: ttl, restartTTL: g.restartTTL, version: idx, shared: shared})
}

func (f *fsm) acquire(idx uint64, c *command, evs []event) (applyResult, []event) {
	e := f.locks.get(c.key)
	if c.shared {
		return f.acquireShared(idx, c, e, evs)
	}
	if e == nil {
		if f.leases() >= c.maxLeases {
			return applyResult{code: resTooManyLeases}, evs
		}
		e = newLockEntry()
		f.locks.put(c.key, e)
		evs = f.setGrant(idx, c.key, e, waiter{owner: c.owner, p: f.strs.get(c.holder, c.session), ttl: c.ttl, lockDelay: c.lockDelay}, false, evs)
		return applyResult{code: resGranted, fence: e.grant.fence, ttl: c.ttl}, evs
	}
	if e.held && e.grant.owner == c.owner {
		// A retried request of the holder (its answer was lost): the grant
		// stands, and the retry renews it through the log with the TTL it
		// asks for, so that the answer is one the server honours. It also
		// binds the grant to the retry's session, when it names one (a
		// lease resumed by another process: its loss is pushed there).
		f.rebindSession(&e.grant, c.session)
		evs = restartGrant(idx, c.key, &e.grant, false, c.ttl, evs)
		return applyResult{code: resGranted, fence: e.grant.fence, ttl: c.ttl}, evs
	}
	if e.shared[c.owner] != nil {
		// The owner token holds a Shared grant of the key: it is never
		// queued for the Exclusive one too.
		return applyResult{code: resHeld}, evs
	}
	if n := e.q.find(c.owner); n != nil {
		if !c.wait || n.shared { // the owner waits already; a try of the same owner is refused
			return applyResult{code: resHeld}, evs
		}
		n.since = idx // re-attached: a purge of its grace named an earlier since
		return applyResult{code: resQueued, position: e.q.position(n)}, evs
	}
	if !c.wait {
		if !e.held && len(e.shared) == 0 {
			return applyResult{code: resDelayed}, evs
		}
		return applyResult{code: resHeld}, evs
	}
	if uint64(e.q.len()) >= c.maxWaiters {
		return applyResult{code: resTooManyWaiters}, evs
	}
	if c.maxTotalWaiters > 0 && uint64(f.waiting) >= c.maxTotalWaiters {
		return applyResult{code: resTooManyQueued}, evs
	}
	e.own().q.push(waiter{owner: c.owner, p: f.strs.get(c.holder, c.session), ttl: c.ttl, lockDelay: c.lockDelay, since: idx})
	f.waiting++
	evs = append(evs, event{kind: evQueued, key: c.key, owner: c.owner, version: idx})
	return applyResult{code: resQueued, position: e.q.len()}, evs
}

// setGrant makes w the holder of e with version idx and the next fence
// (idx, unless a Shared grant took it: nextFence).
func (f *fsm) setGrant(idx uint64, key string, e *lockEntry, w waiter, handoff bool, evs []event) []event {
	e.held = true
	if e.entryExtra != noExtra {
		e.delay, e.delayVersion = 0, 0
		e.trim()
	}
	fence := f.nextFence(idx)
	e.grant = grant{owner: w.owner, p: w.p, fence: fence, ttl: w.ttl, restartTTL: w.ttl, lockDelay: w.lockDelay, version: idx}
	return append(evs, event{kind: evGranted, key: key, owner: w.owner, session: w.session(), holder: w.holder(), fence: fence, ttl: w.ttl, restartTTL: w.ttl, version: idx, handoff: handoff})
}

// endGrant ends the grant of e. After a loss without a release (expiry,
// force release) with a lock-delay, the key enters its lock-delay;
// otherwise the head waiter, if any, is granted with fence idx. It returns
// the new fence, or 0 when nobody was granted.
func (f *fsm) endGrant(idx uint64, key string, e *lockEntry, why removeReason, evs []event) (uint64, []event) {
	g := e.grant
	evs = append(evs, event{kind: evRemoved, key: key, owner: g.owner, session: g.session(), holder: g.holder(), fence: g.fence, ttl: g.ttl, version: g.version, reason: why})
	f.strs.put(g.p)
	e.held = false
	e.grant = grant{}
	if g.lockDelay > 0 && (why == reasonExpired || why == reasonForced) {
		x := e.own()
		x.delay, x.delayVersion = g.lockDelay, idx
		evs = append(evs, event{kind: evDelayed, key: key, ttl: g.lockDelay, version: idx})
		return 0, evs
	}
	return f.grantNext(idx, key, e, evs)
}

// grantNext grants, in queue order, the head waiters of e that the grants
// it still holds allow: the Exclusive head when e holds nothing, Shared
// heads while e holds no Exclusive grant and its limit allows (several in
// one entry, each with its own fence). A Shared waiter behind a blocked
// head waits (FIFO: a waiting Exclusive request holds back later Shared
// ones, writer preference). It removes e when it holds nothing, runs no
// lock-delay and nobody waits. It returns the first new fence or 0.
func (f *fsm) grantNext(idx uint64, key string, e *lockEntry, evs []event) (uint64, []event) {
	var first uint64
	for n := e.q.head; n != nil && !e.held && e.delayVersion == 0; n = e.q.head {
		if n.shared && e.limit > 0 && len(e.shared) >= e.limit || !n.shared && len(e.shared) > 0 {
			break
		}
		e.q.remove(n)
		f.waiting--
		var fence uint64
		if n.shared {
			e.nsw--
			fence, evs = f.grantShared(idx, key, e, n.waiter, true, evs)
		} else {
			evs = f.setGrant(idx, key, e, n.waiter, true, evs)
			fence = e.grant.fence
		}
		if first == 0 {
			first = fence
		}
	}
	if !e.held && e.delayVersion == 0 && len(e.shared) == 0 && e.q.len() == 0 {
		f.locks.del(key)
	} else {
		e.trim()
	}
	return first, evs
}

// cancelWait removes owner's queue entry on key; with releaseGrant, it also
// releases owner's grant on key (a grant that raced the cancellation).
func (f *fsm) cancelWait(idx uint64, key, owner string, releaseGrant bool, evs []event) (applyResult, []event) {
	e := f.locks.get(key)
	if e == nil {
		return applyResult{code: resOK}, evs
	}
	if n := e.q.find(owner); n != nil {
		e.q.remove(n)
		f.waiting--
		f.strs.put(n.p)
		evs = append(evs, event{kind: evDequeued, key: key, owner: owner, session: n.session()})
		if n.shared {
			e.nsw--
		} else if e.nsw > 0 {
			// An Exclusive entry that held Shared ones back is gone: the
			// Shared entries now at the head may be granted.
			_, evs = f.grantNext(idx, key, e, evs)
		}
		e.trim()
		return applyResult{code: resOK, dequeued: true}, evs
	}
	if releaseGrant && e.held && e.grant.owner == owner {
		_, evs = f.endGrant(idx, key, e, reasonCancelled, evs)
		return applyResult{code: resOK, released: true}, evs
	}
	if g := liveShared(e, owner); releaseGrant && g != nil {
		_, evs = f.endShared(idx, key, e, g, reasonCancelled, evs)
		return applyResult{code: resOK, released: true}, evs
	}
	return applyResult{code: resOK}, evs
}

// holderView is a read-only copy of one key's state.
type holderView struct {
	key     string
	held    bool  // false: in a lock-delay (or only lost Shared grants in theirs)
	grant   grant // when held: the Exclusive grant, or the oldest live Shared grant
	waiters int
	queued  bool // peek: the asking owner is queued on the key
	// shared: the key holds Shared grants (see sharedInto): holders live
	// ones, delayed lost ones in their lock-delay, of limit permits (0:
	// any number); grants (get only) every live one, by fence.
	shared  bool
	limit   int
	holders int
	delayed int
	grants  []grant
	// lostOwners (get only): the owners of the lost Shared grants whose
	// lock-delay runs.
	lostOwners []string
}

// get returns the state of key: ok is false when the key is neither held
// nor in a lock-delay.
func (f *fsm) get(key string) (holderView, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	e := f.locks.get(key)
	if e == nil {
		return holderView{}, false
	}
	v := holderView{key: key, held: e.held, grant: e.grant, waiters: e.q.len()}
	sharedInto(e, &v, true)
	return v, true
}

// peek returns the state of key as an acquisition by owner would find it.
func (f *fsm) peek(key, owner string) (holderView, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	e := f.locks.get(key)
	if e == nil {
		return holderView{}, false
	}
	v := holderView{key: key, held: e.held, grant: e.grant, waiters: e.q.len(), queued: e.q.find(owner) != nil}
	sharedInto(e, &v, false)
	return v, true
}

// list returns up to limit held keys that start with prefix and sort after
// after (all of them when after is empty), in key order. It walks the
// ordered index from the first candidate and copies only the page: its cost
// is the page, not the table. more reports whether held keys follow.
func (f *fsm) list(prefix, after string, limit int) (out []holderView, more bool) {
	return f.listIn([]string{prefix}, after, limit)
}

// listIn is list over several prefixes: the held keys that start with one
// of prefixes (ascending and disjoint: none a prefix of another, as
// minimalPrefixes returns them) and sort after after, in key order. It
// reads only keys under prefixes (a caller's readable ranges, auth.go):
// more too is about those keys alone.
func (f *fsm) listIn(prefixes []string, after string, limit int) (out []holderView, more bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out = make([]holderView, 0, min(limit, 64))
	entries := 0
	for _, prefix := range prefixes {
		from := prefix
		if after != "" && after >= from {
			if !strings.HasPrefix(after, prefix) && after > prefix {
				continue // the whole range sorts before after
			}
			from = after + "\x00"
		}
		f.locks.ascend(from, func(k string, e *lockEntry) bool {
			if !strings.HasPrefix(k, prefix) {
				return false
			}
			v := holderView{key: k, held: e.held, grant: e.grant, waiters: e.q.len()}
			sharedInto(e, &v, true)
			if !v.held {
				return true
			}
			// A key with Shared grants is listed as one entry per grant
			// (at most maxInspectGrants), never split over pages: the
			// limit counts entries, and a page holds at least one key.
			n := 1
			if v.shared {
				n = min(v.holders, maxInspectGrants)
			}
			if len(out) > 0 && entries+n > limit {
				more = true
				return false
			}
			out = append(out, v)
			entries += n
			return true
		})
		if more {
			break
		}
	}
	return out, more
}

// queue returns up to limit of key's queue entries, head first, and the
// queue's length (0 when the key has no entry in the table).
func (f *fsm) queue(key string, limit int) (ws []waiter, n int) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	e := f.locks.get(key)
	if e == nil {
		return nil, 0
	}
	ws = make([]waiter, 0, min(limit, e.q.len()))
	for x := e.q.head; x != nil && len(ws) < limit; x = x.next {
		ws = append(ws, x.waiter)
	}
	return ws, e.q.len()
}

// queuedEntry is one queue entry as a new leader sees it.
type queuedEntry struct {
	ko    keyOwner
	ttl   time.Duration // the waiter's TTL: its grace after a leader change
	since uint64        // index that queued or last re-attached it
}

// queued returns every queue entry.
func (f *fsm) queued() []queuedEntry {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []queuedEntry
	for k, e := range f.locks.all() {
		e.q.each(func(w *waiter) {
			out = append(out, queuedEntry{ko: keyOwner{key: k, owner: w.owner}, ttl: w.ttl, since: w.since})
		})
	}
	return out
}

// counts returns the number of leases (held keys and keys in a
// lock-delay, each Shared grant counted as one) and of queue entries.
func (f *fsm) counts() (held, waiting int) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return int(f.leases()), f.waiting
}

// state returns one evGranted event per held key and one evDelayed event
// per key in a lock-delay: what a lease clock needs to start over.
func (f *fsm) state() []event {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return stateLocked(f.locks)
}

func stateLocked(locks lockTable) []event {
	out := make([]event, 0, locks.len())
	for k, e := range locks.all() {
		switch {
		case e.held:
			g := &e.grant
			out = append(out, event{kind: evGranted, key: k, owner: g.owner, session: g.session(), holder: g.holder(), fence: g.fence, ttl: g.ttl, restartTTL: g.restartTTL, version: g.version, suspect: g.suspect, left: g.suspectLeft})
		case e.delayVersion != 0:
			out = append(out, event{kind: evDelayed, key: k, ttl: e.delay, version: e.delayVersion})
		}
		for _, g := range e.shared {
			if g.delayed {
				out = append(out, event{kind: evDelayed, key: k, owner: g.owner, ttl: g.lockDelay, version: g.version, shared: true})
				continue
			}
			out = append(out, event{kind: evGranted, key: k, owner: g.owner, session: g.session(), holder: g.holder(), fence: g.fence, ttl: g.ttl, restartTTL: g.restartTTL, version: g.version, suspect: g.suspect, left: g.suspectLeft, shared: true})
		}
	}
	return out
}

// check verifies the table's invariants and returns the first violation:
// every entry is held or in a lock-delay; queue links, owner index and
// counts agree; no owner is queued twice on a key or queued where it holds.
// Tests and fuzzing call it.
func (f *fsm) check() error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !noExtra.empty() {
		return fmt.Errorf("the shared empty entryExtra was written: %+v", *noExtra)
	}
	waiting, nshared, sharedKeys := 0, 0, 0
	for k, e := range f.locks.all() {
		if !e.held && e.delayVersion == 0 && len(e.shared) == 0 {
			return fmt.Errorf("key %q: neither held nor in a lock-delay", k)
		}
		if e.held && (e.grant.fence == 0 || e.grant.version == 0 || e.grant.fence > f.lastFence) {
			return fmt.Errorf("key %q: grant fence %d version %d (last fence %d)", k, e.grant.fence, e.grant.version, f.lastFence)
		}
		if err := f.checkShared(k, e); err != nil {
			return err
		}
		nshared += len(e.shared)
		if len(e.shared) > 0 {
			sharedKeys++
		}
		if e.held && e.grant.suspect != (e.grant.suspectLeft > 0) {
			return fmt.Errorf("key %q: suspect %v with %v left", k, e.grant.suspect, e.grant.suspectLeft)
		}
		n := 0
		var prev *waitNode
		for x := e.q.head; x != nil; x = x.next {
			n++
			if x.prev != prev {
				return fmt.Errorf("key %q: broken queue link at %q", k, x.owner)
			}
			if e.q.byOwner[x.owner] != x {
				return fmt.Errorf("key %q: owner index misses %q (queued twice?)", k, x.owner)
			}
			if e.held && x.owner == e.grant.owner || e.shared[x.owner] != nil {
				return fmt.Errorf("key %q: holder %q also queued", k, x.owner)
			}
			prev = x
		}
		if prev != e.q.tail || n != len(e.q.byOwner) {
			return fmt.Errorf("key %q: queue of %d entries, index of %d", k, n, len(e.q.byOwner))
		}
		waiting += n
	}
	if waiting != f.waiting {
		return fmt.Errorf("waiting count %d, queues hold %d", f.waiting, waiting)
	}
	if nshared != f.nshared || sharedKeys != f.sharedKeys {
		return fmt.Errorf("shared counts %d grants on %d keys, table holds %d on %d", f.nshared, f.sharedKeys, nshared, sharedKeys)
	}
	return nil
}

// Snapshot encodes the table, in the snapshot format below, under the read
// lock (Raft calls it between batches of Apply); Persist writes the bytes
// without the lock. Encoding at once keeps one copy of the table, in its
// encoded form (about 110 bytes a plain held key), while Persist runs,
// not a copy of every entry's structures and then their encoding.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	// v3: the table holds nothing that v3 lacks (no Shared grant or
	// waiter, and no fence above the applied index, which a v3 restore
	// could not know of), so it is written in v3, which members that
	// predate Shared grants can read.
	v3 := f.nshared == 0 && f.lastFence <= f.applied && !f.anySharedWaiter()
	s := &fsmSnapshot{}
	e := enc{b: make([]byte, 0, snapshotChunk)}
	if v3 {
		e.str(snapshotMagicV3)
		e.u64(f.applied)
	} else {
		e.str(snapshotMagic)
		e.u64(f.applied)
		e.u64(f.lastFence)
	}
	e.u64(uint64(f.locks.len()))
	for k, en := range f.locks.all() {
		encodeSnapEntry(&e, k, en, v3)
		if len(e.b) >= snapshotChunk-1024 {
			s.chunks = append(s.chunks, e.b)
			e.b = make([]byte, 0, snapshotChunk)
		}
	}
	e.b = appendMembersSection(e.b, f.members)
	s.chunks = append(s.chunks, e.b)
	return s, nil
}

// snapshotChunk is the size of the buffers a snapshot is encoded in.
const snapshotChunk = 64 << 10

// Snapshot formats: v1 (held keys and queues), v2 and v3 are still read;
// v2 adds grant versions, lock-delays and waiting lock-delays, and the
// applied index; v3 adds each grant's suspect entry and each waiter's
// since; v4 adds the last fence issued, each key's Shared grants and
// permit limit, and each waiter's kind (shared.go). A table with nothing
// that v3 lacks is still written in v3 (see Snapshot).
const (
	snapshotMagicV1 = "dlockd-snap-v1"
	snapshotMagicV2 = "dlockd-snap-v2"
	snapshotMagicV3 = "dlockd-snap-v3"
	snapshotMagic   = "dlockd-snap-v4"
)

// encodeSnapEntry writes key's entry e: its state, its Shared grants (not
// in v3) and its queue.
func encodeSnapEntry(e *enc, key string, en *lockEntry, v3 bool) {
	g := &en.grant
	e.str(key)
	e.boolean(en.held)
	encodeGrantFields(e, g)
	e.dur(en.delay)
	e.u64(en.delayVersion)
	if !v3 {
		shared := sortedShared(en) // by fence
		e.u64(uint64(en.limit))
		e.u64(uint64(len(shared)))
		for i := range shared {
			encodeSharedGrant(e, &shared[i])
		}
	}
	e.u64(uint64(en.q.len()))
	en.q.each(func(wt *waiter) {
		e.str(wt.owner)
		e.str(wt.holder())
		e.str(wt.session())
		e.dur(wt.ttl)
		e.dur(wt.lockDelay)
		e.u64(wt.since)
		if !v3 {
			e.boolean(wt.shared)
		}
	})
}

// fsmSnapshot is an encoded table: magic, applied index (v4: and last
// fence), count, then per key its state and queue, then the members
// registry as a trailing section (see appendMembersSection).
type fsmSnapshot struct {
	chunks [][]byte
}

// Persist writes the encoded table.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	for _, b := range s.chunks {
		if _, err := sink.Write(b); err != nil {
			_ = sink.Cancel()
			return err
		}
	}
	return sink.Close()
}

// Release drops the encoded table.
func (s *fsmSnapshot) Release() { s.chunks = nil }

// Restore replaces the table with a snapshot's, and the applied index with
// the snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	data, members, err := splitMembersSection(data)
	if err != nil {
		return err
	}
	locks, strs, waiting, applied, lastFence, err := decodeSnapshot(data)
	if err != nil {
		return err
	}
	lastFence, nshared, sharedKeys := restoredShared(locks, lastFence)
	f.mu.Lock()
	f.locks = locks
	f.strs = strs
	f.waiting = waiting
	f.lastFence, f.nshared, f.sharedKeys = lastFence, nshared, sharedKeys
	f.members = members
	if applied > f.applied {
		f.applied = applied
	}
	st := stateLocked(locks)
	f.mu.Unlock()
	if f.obs != nil {
		f.obs.lockReset(st)
	}
	return nil
}

func decodeSnapshot(data []byte) (locks lockTable, strs interner, waiting int, applied, lastFence uint64, err error) {
	d := dec{b: data}
	strs = newInterner()
	magic := d.str()
	if d.err != nil || (magic != snapshotMagic && magic != snapshotMagicV3 && magic != snapshotMagicV2 && magic != snapshotMagicV1) {
		return lockTable{}, strs, 0, 0, 0, errCorrupt
	}
	v4 := magic == snapshotMagic
	v3 := v4 || magic == snapshotMagicV3
	v2 := v3 || magic == snapshotMagicV2
	if v2 {
		applied = d.u64()
	}
	if v4 {
		lastFence = d.u64()
	}
	n := d.u64()
	if n > uint64(len(d.b)) {
		return lockTable{}, strs, 0, 0, 0, errCorrupt
	}
	locks = newLockTable()
	for i := uint64(0); i < n && d.err == nil; i++ {
		key := d.str()
		e := newLockEntry()
		e.held = true
		if v2 {
			e.held = d.boolean()
		}
		e.grant = grant{owner: d.str(), p: strs.get(d.str(), d.str()), fence: d.u64(), ttl: d.dur()}
		if v2 {
			e.grant.lockDelay = d.dur()
			e.grant.version = d.u64()
			e.grant.restartTTL = d.dur()
			if v3 {
				e.grant.suspect = d.boolean()
				e.grant.suspectLeft = d.dur()
				if e.grant.suspect != (e.grant.suspectLeft > 0) {
					return lockTable{}, strs, 0, 0, 0, errCorrupt
				}
			}
			if delay, version := d.dur(), d.u64(); delay != 0 || version != 0 {
				x := e.own()
				x.delay, x.delayVersion = delay, version
			}
		} else {
			e.grant.version = e.grant.fence
			e.grant.restartTTL = e.grant.ttl
		}
		if v4 {
			if err := decodeSharedEntry(&d, e, strs); err != nil {
				return lockTable{}, strs, 0, 0, 0, err
			}
		}
		if !e.held && e.delayVersion == 0 && len(e.shared) == 0 {
			return lockTable{}, strs, 0, 0, 0, errCorrupt
		}
		if !e.held {
			strs.put(e.grant.p)
			e.grant = grant{}
		}
		nw := d.u64()
		if nw > uint64(len(d.b)) {
			return lockTable{}, strs, 0, 0, 0, errCorrupt
		}
		for j := uint64(0); j < nw && d.err == nil; j++ {
			w := waiter{owner: d.str(), p: strs.get(d.str(), d.str()), ttl: d.dur()}
			if v2 {
				w.lockDelay = d.dur()
			}
			if v3 {
				w.since = d.u64()
			}
			if v4 {
				w.shared = d.boolean()
			}
			if e.q.find(w.owner) != nil || e.shared[w.owner] != nil {
				return lockTable{}, strs, 0, 0, 0, errCorrupt
			}
			x := e.own()
			if w.shared {
				x.nsw++
			}
			x.q.push(w)
		}
		waiting += e.q.len()
		if locks.get(key) != nil {
			return lockTable{}, strs, 0, 0, 0, errCorrupt
		}
		locks.put(key, e)
	}
	if d.err != nil {
		return lockTable{}, strs, 0, 0, 0, d.err
	}
	return locks, strs, waiting, applied, lastFence, nil
}
