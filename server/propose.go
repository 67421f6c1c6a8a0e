package server

// propose.go owns the proposal batcher: it turns the commands that
// concurrent requests (of every connection, and the server's own loops)
// propose into Raft log entries, many commands to an entry when busy and
// none added when idle (group commit). It touches only the batcher's
// state and s.raft; the FSM applies what it writes (fsm.go ApplyBatch).
//
// One round of entries is in flight at a time. A proposal that finds no
// round in flight is sent at once, from its caller's goroutine, as a plain
// entry: an idle server adds no wait and no goroutine hop. Proposals that
// arrive while a round is in flight collect in the queue; when the round
// is committed and applied, the whole queue goes as the next round, split
// into entries of at most maxBatchCount commands and about maxBatchBytes
// bytes, all handed to Raft at once (Raft writes them with one fsync). So
// under load each fsync carries every command that arrived during the
// previous one, with one raft.Apply, one future and one FSM call per
// entry rather than per command. (A queue that holds only deferred
// proposals, waits for held keys, is the exception: it waits for the next
// proposal or its timer; see proposeQueued and nextRound.)

import (
	"sync"
	"time"

	"google.golang.org/grpc/codes"
)

// Bounds of one batch entry: commands, and encoded bytes (a single command
// larger than maxBatchBytes still goes, alone).
const (
	maxBatchCount = 512
	maxBatchBytes = 256 << 10
)

// maxQueueDefer bounds how long a wait for a held key (proposeQueued)
// waits for another proposal to ride with when nothing else is proposed.
const maxQueueDefer = 2 * time.Millisecond

// proposal is one command waiting for its entry to be applied. Proposals
// are reused (proposalPool): nothing may touch one after its done signal.
type proposal struct {
	data []byte // the command's plain encoding (never reused: Raft keeps it)
	res  applyResult
	err  error
	// queued: its caller waits on done, which the round that carries it
	// signals once res or err is set (false: its caller sends the round
	// itself). done has room for that one signal.
	queued bool
	// deferred: a proposeQueued proposal, which waits for company.
	deferred bool
	done     chan struct{}
}

var proposalPool = sync.Pool{New: func() any { return &proposal{done: make(chan struct{}, 1)} }}

// proposer is the batcher's state.
type proposer struct {
	mu    sync.Mutex
	busy  bool        // a round is in flight: new proposals queue
	queue []*proposal // the next round
	// deferTimer starts a round for deferred proposals (proposeQueued)
	// that nothing else took along; deferArmed: it is set to fire.
	deferTimer *time.Timer
	deferArmed bool
	// deferDue: the timer of the deferred proposals fired while a round
	// was in flight, so that round's end sends them even with nothing
	// else queued (see nextRound).
	deferDue   bool
	queueDefer time.Duration // 0: maxQueueDefer (tests set it)
	// entries and commands count what was written (tests).
	entries, commands uint64
}

// propose commits c through Raft and returns its result. It sends c at
// once when no round is in flight (c alone, as a plain entry), otherwise
// with the commands that queue meanwhile in the next round.
func (s *Server) propose(c *command) (applyResult, error) {
	return s.proposeWith(c, false)
}

// proposeQueued is propose for an acquisition with wait of a key that is
// held: it will most likely be queued, and its caller waits for the
// holder's release anyway, so when no round is in flight it does not
// start one alone but waits, up to maxQueueDefer, for the next proposal
// to take it along. In a handoff loop (W2: the previous holder queues
// again while the new holder claims and releases) the queue entry then
// shares the release's entry and fsync instead of taking one of its own
// that the release would wait behind: one disk write per handoff, not two.
// A release never waits for it; the queue entry is acknowledged, as
// always, only once committed.
func (s *Server) proposeQueued(c *command) (applyResult, error) {
	return s.proposeWith(c, true)
}

func (s *Server) proposeWith(c *command, deferred bool) (applyResult, error) {
	start := time.Now()
	p := proposalPool.Get().(*proposal)
	p.data, p.deferred = c.encode(), deferred
	b := &s.proposer
	b.mu.Lock()
	switch {
	case b.busy || deferred:
		p.queued = true
		b.queue = append(b.queue, p)
		if !b.busy {
			b.armDefer(s)
		}
		b.mu.Unlock()
		<-p.done
	default:
		// Deferred proposals waiting in the queue go first, in this
		// caller's round.
		round := append(b.takeQueue(), p)
		b.busy = true
		b.mu.Unlock()
		s.sendRound(round)
		if next := s.nextRound(); next != nil {
			// Proposals queued behind this one: a goroutine sends them
			// (and those that queue behind them), so that this caller
			// does not wait for a commit that is not its own.
			go s.sendRounds(next)
		}
	}
	res, err := p.res, p.err
	*p = proposal{done: p.done}
	proposalPool.Put(p)
	if err != nil {
		return applyResult{}, err
	}
	s.metrics.applySeconds.Observe(time.Since(start).Seconds())
	return res, nil
}

// sendDeferred starts a round for the deferred proposals that no other
// proposal took along within maxQueueDefer.
func (s *Server) sendDeferred() {
	b := &s.proposer
	b.mu.Lock()
	b.deferArmed = false
	if b.busy {
		// The round in flight sends them when it ends (nextRound).
		b.deferDue = len(b.queue) > 0
		b.mu.Unlock()
		return
	}
	if len(b.queue) == 0 {
		b.mu.Unlock()
		return
	}
	q := b.takeQueue()
	b.busy = true
	b.mu.Unlock()
	s.sendRounds(q)
}

// nextRound takes the queue, or ends the busy state when it is empty or
// holds only deferred proposals whose time has not come: those keep
// waiting for the next proposal to take them along (or for their timer),
// so that a queue entry made during a release's round rides with the next
// release instead of taking a round, and an fsync, alone that the release
// would then wait behind.
func (s *Server) nextRound() []*proposal {
	b := &s.proposer
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 || (!b.deferDue && b.onlyDeferred()) {
		b.busy = false
		if len(b.queue) > 0 {
			b.armDefer(s)
		}
		return nil
	}
	return b.takeQueue()
}

// onlyDeferred reports whether every queued proposal is deferred; with
// b.mu held.
func (b *proposer) onlyDeferred() bool {
	for _, p := range b.queue {
		if !p.deferred {
			return false
		}
	}
	return true
}

// armDefer sets the timer that sends the queued deferred proposals
// (sendDeferred) unless it is set already; with b.mu held.
func (b *proposer) armDefer(s *Server) {
	if b.deferArmed {
		return
	}
	b.deferArmed = true
	d := b.queueDefer
	if d == 0 {
		d = maxQueueDefer
	}
	if b.deferTimer == nil {
		b.deferTimer = time.AfterFunc(d, s.sendDeferred)
	} else {
		b.deferTimer.Reset(d)
	}
}

// takeQueue empties the queue for a round and disarms the timer of
// deferred proposals, which go in that round; with b.mu held.
func (b *proposer) takeQueue() []*proposal {
	q := b.queue
	b.queue = nil
	b.deferDue = false
	if b.deferArmed && b.deferTimer.Stop() {
		b.deferArmed = false
	}
	return q
}

// sendRounds sends ps, then every round that queued meanwhile, until the
// queue is empty.
func (s *Server) sendRounds(ps []*proposal) {
	for ps != nil {
		s.sendRound(ps)
		ps = s.nextRound()
	}
}

// sendRound writes ps as entries, waits until each is applied and answers
// every proposal (closing its done channel). Without batchEntries, each
// command is its own plain entry (still handed to Raft together).
func (s *Server) sendRound(ps []*proposal) {
	batch := len(ps) > 1 && s.batchEntries()
	type entry struct {
		ps     []*proposal
		future interface {
			Error() error
			Response() interface{}
		}
	}
	var entries []entry
	for len(ps) > 0 {
		n, size := 1, len(ps[0].data)
		for batch && n < len(ps) && n < maxBatchCount && size+len(ps[n].data) <= maxBatchBytes {
			size += len(ps[n].data)
			n++
		}
		subs := make([][]byte, n)
		for i, p := range ps[:n] {
			subs[i] = p.data
		}
		entries = append(entries, entry{ps: ps[:n], future: s.raft.Apply(batchEntry(subs), s.cfg.ApplyTimeout)})
		ps = ps[n:]
	}
	for _, e := range entries {
		err := e.future.Error()
		var rs batchResult
		if err == nil {
			switch r := e.future.Response().(type) {
			case applyResult:
				rs = batchResult{r}
			case batchResult:
				rs = r
			}
		}
		for i, p := range e.ps {
			switch {
			case err != nil:
				p.err = s.raftErr(err)
			case len(rs) != len(e.ps) || rs[i].code == resBadCommand:
				p.err = apiErr(codes.Internal, ReasonInternal, "command not applied")
			default:
				p.res = rs[i]
			}
			if p.queued {
				p.done <- struct{}{} // p is its caller's from here
			}
		}
	}
	b := &s.proposer
	b.mu.Lock()
	b.entries += uint64(len(entries))
	for _, e := range entries {
		b.commands += uint64(len(e.ps))
	}
	b.mu.Unlock()
}
