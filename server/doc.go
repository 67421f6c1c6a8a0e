// Package server is dlockd, the dlock lock server, as a library: a lock
// table replicated by hashicorp/raft and served over gRPC and JSON over HTTP
// on one port. cmd/dlockd is a thin main around it; a Go program can embed a
// node in-process with New, Start and Shutdown.
//
//	srv, err := server.New(server.DefaultConfig()) // 127.0.0.1:7450, ./dlockd-data
//	if err != nil { ... }
//	if err := srv.Start(); err != nil { ... }
//	defer srv.Close()
//
// Clients reach it as dlockd://127.0.0.1:7450 with package
// drivers/dlockddriver, or with curl:
//
//	curl -d '{"key":"k","ttl":"30s"}' localhost:7450/v1/acquire
//
// # State machine
//
// The lock table (per key: holder, owner token, fence, TTL, holder text,
// FIFO queue of waiters) is the Raft FSM. Apply is deterministic: it reads no
// clock, no randomness and does no I/O; limits it enforces (waiters per key,
// leases per server) travel inside each command. The whole table is
// snapshotted and restored. The log is hashicorp/raft-wal in
// Config.DataDir/wal (segment files, one write and one fsync per batch); the
// stable store (term, vote) is a bbolt file (hashicorp/raft-boltdb/v2),
// raft.db. A data directory whose log is in raft.db (written by an earlier
// version) keeps its log there. Snapshots are files in the same directory.
//
// The fence of a grant is the Raft log index of the entry that made it, or,
// when an earlier grant took that number already (one entry can grant
// several Shared grants, below, and one batch entry carries many commands:
// see Batching), one more than the greatest fence issued
// (the FSM's lastFence: fence = max(index, lastFence+1)). So every grant has
// its own fence, a key's fences are strictly increasing in grant order,
// never reused, and survive restarts (lastFence is replayed from the log
// and kept in snapshots; a snapshot written before it existed restores it
// as its greatest fence, which was an index no greater than the snapshot's).
// While no entry ever made two grants, fences are exactly the indexes, as
// before. Fences are unique server-wide, but only a key's are ordered for a
// resource to compare.
//
// # Shared grants
//
// A key holds either one Exclusive grant (a plain lock), or Shared grants
// (AcquireRequest.shared): up to the key's permit limit of them (a
// semaphore's permits, 1 to MaxPermits), or any number when the limit is 0
// (the readers of a read-write lock). Every Shared grant is a grant as
// above: its own owner token, TTL, countdown and version, claim window,
// suspect mark, fence and session, renewed, released, expired, cancelled
// and purged by (key, owner) through the same commands, and counted as one
// lease against MaxLeases. The key's queue is FIFO over both kinds: the head
// is granted as soon as the grants held allow it, and one entry (a release,
// an expiry, the end of a lock-delay, a cancelled waiter that held others
// back) grants every head waiter it can, in order, each with its own fence.
// A Shared request never passes a waiter (FIFO), so a waiting Exclusive
// request holds back every later Shared one: writer preference, without
// which a steady stream of readers starves a writer. A request whose limit
// differs from that of the key's Shared grants or waiters is refused
// (INVALID_ARGUMENT, LIMIT_MISMATCH, naming the key's limit): two programs
// that disagree on the number of permits would otherwise each believe its
// own bound. A Shared grant lost without a release (expiry) keeps its permit
// taken, and the key closed to Exclusive grants, for its lock-delay, the
// same protection for in-flight writes as a plain lock's; opEndSharedDelay
// frees it. A force release removes every grant of the key (its oldest is
// answered, with their number) and the key then runs the longest lock-delay
// among them. Inspect of a Shared key describes its oldest live grant with
// the count and limit, and lists each live grant; List shows the key once.
// Shared acquisitions are written as version-3 commands; every other
// command is still written at version 2, and a snapshot of a table without
// Shared grants is still written in the v3 snapshot format, so that members
// that predate Shared grants keep reading the log and snapshots of a
// cluster that makes none. Upgrade every member before the first Shared
// acquisition: an older member cannot apply it.
//
// A release, an expiry or a cancelled grant hands the key to the head waiter
// in the same log entry, and the waiter's request is answered when that entry
// is applied: no polling, no herd, FIFO. Each key's queue is a doubly linked
// list with an index by owner token, so enqueue, handover and the cancel of
// any entry cost O(1) however long the queue (a slice used to be copied on
// every cancel: 10,000 cancels allocated gigabytes and stalled the FSM).
// The table is one ordered index (a B-tree of key and entry, table.go), so a
// List page costs the page, not the table, and pages follow with a page
// token; a lookup is O(log n).
//
// # Grant versions
//
// Every grant carries a version: the index of the entry that last set its
// countdown (the grant itself, a TTL change, a retried acquire by its
// holder). The leader's expiry entry names the version whose countdown it saw
// run out, and the FSM ignores an expiry of an older version. Without it, a
// renewal that changed the TTL could be acknowledged (its entry committed)
// while an expiry proposed a moment earlier, for the old countdown, was
// still in flight and then ended the grant the holder had just been told was
// renewed. The same holds for the release of an unclaimed handover.
//
// A deadline never moves earlier. A renewal, TTL change or retry with a
// shorter TTL keeps the end already acknowledged (the countdown runs to the
// later of the two), and the grant remembers its longest TTL, with which a
// new leader restarts it: otherwise a client whose shortening renewal went
// unanswered, or that had two renewals in flight, would still rely on an end
// the server had moved forward.
//
// A repeated Acquire by the current owner (a retry whose answer was lost)
// renews the grant through the log with the TTL it asks for and answers that
// TTL: the server never answers a grant it will not honour.
//
// A try (Acquire without wait) that finds the key held by another owner, in
// its lock-delay, or already waited for by the same owner, is refused from
// the leader's state after a linearizable read (see Reads): a refusal
// changes nothing, so it writes no log entry and waits for no fsync.
//
// # Claims of handed-over grants
//
// A waiter granted by a handover (the key was released or expired while it
// waited) is told so with claim_within in its grant, and must confirm the
// grant with a renewal within Config.ClaimWindow, or the leader releases it
// to the next waiter (reason UNCLAIMED). A waiter that vanished without
// closing its connection (a stopped process, a cut cable) would otherwise
// keep the key for its whole TTL: sending it the grant succeeds into the
// socket buffer. A failed send releases the grant at once. The claim is
// safe for a live client: its validity is measured from when it sent the
// wait, before the grant, and until the claiming renewal is acknowledged it
// ends no later than that moment plus claim_within (less its drift), before
// the leader's claim deadline (the handover plus Config.ClaimWindow); a
// renewal arriving after the claim deadline is refused, as the release may
// already be proposed. So the client may act on the grant at once and
// claim it in the background (the dlock library does, through the dlockd
// driver's WaitUnconfirmed: the claim is its lease's first renewal, a few
// milliseconds after the grant, and a lease released before that never
// sends it), which keeps the claim's round trip off a contended key's
// handoff. This needs every member to run the same Config.ClaimWindow: the
// grant carries the answering node's, and the leader enforces its own. A
// new leader cannot know whether a claim reached its predecessor, so it
// treats every grant as claimed (late, never early).
//
// # Lock-delay and force release
//
// After a grant is lost without a release by its owner (an expiry, a force
// release), its key is granted to nobody for the grant's lock-delay (the
// request's lock_delay, else Config.LockDelay capped at the TTL; Chubby's
// and Consul's lock-delay), so that writes the paused holder still has in
// flight land before a new holder starts. The FSM marks the key as delayed
// with the entry's index as version; the leader's countdown proposes the end
// of the delay, which hands the key to the head waiter. A new leader
// restarts each delay in full. A voluntary release never delays.
//
// ForceRelease is the operator's override for a holder known to be dead: it
// ends the grant whoever holds it (a reason is required and logged), the
// holder's Watch streams hear LOST at once, and the next grant gets a
// greater fence, so a holder that was in fact alive is fenced out at the
// resource.
//
// # Expiry
//
// Each node keeps, outside the FSM, a countdown per held key on its
// monotonic clock, started when the grant is applied. Only the leader acts on
// it: when a countdown runs out it proposes an "expire key K owner O" entry,
// which the FSM applies only if O still holds K. When a node becomes leader
// (including a single node after a restart) it first applies its whole log,
// then restarts every countdown at its grant's full TTL (a suspect grant at
// the time left its suspect entry logged: see Suspect leases): expiry can
// come late, never early.
//
// # Renewals and the leader's lease
//
// Renewals do not go through the log: a renewal moves only the leader's
// in-memory countdown. This is safe because of the following argument.
//
//  1. A client computes its validity as sent + TTL − drift, where sent is
//     when it sent the renewal (or the acquisition) request.
//  2. The leader acknowledges a renewal only after raft's VerifyLeader has
//     confirmed, after the request arrived, that a quorum still follows it,
//     and then sets the countdown to now + TTL, with now later than sent.
//  3. A follower that acknowledged the leader (the quorum of step 2) does
//     not vote for another candidate until it has heard nothing from the
//     leader for its heartbeat timeout; hashicorp/raft's LeaderLeaseTimeout
//     (at most the heartbeat timeout, checked by Config.Validate) makes a
//     leader that lost its quorum step down before any election can succeed.
//     So any new leader is elected after the moment of step 2.
//  4. A new leader restarts every countdown at the full TTL from its
//     election, so it expires the grant no earlier than
//     election + TTL > (moment of step 2) + TTL > sent + TTL, which is after
//     the client's validity ends.
//  5. A deposed leader may still hold a longer countdown, but it cannot
//     commit the expire entry (nor anything else) without a quorum.
//
// Hence no leader ever expires a grant that its holder may still believe
// valid. A renewal that changes the TTL goes through the log, so that a new
// leader restarts the countdown with the new TTL. For a single node, step 2
// is immediate and step 3 is moot: VerifyLeader would answer from raft's
// leader loop with a quorum of one, so a sole voter (the latest
// configuration names it alone) reads raft's leader state instead and does
// not wait for that loop, which is busy during every log write. Step 2's check is shared by concurrent renewals and reads, each
// waiting for a round that started after it arrived (see Reads). The cluster
// scenarios of server/clustertest (a leader cut off from both followers, a
// paused old leader) test steps 3 and 5.
//
// # Clocks
//
// No clock is compared across machines, but the argument above needs one
// thing of the leader's monotonic clock: that it runs at the rate of each
// client's, within the drift the client subtracts (1% of the TTL + 2 ms by
// default). A leader whose clock runs fast, or jumps forward (a hypervisor
// that moves CLOCK_MONOTONIC on resume, a broken TSC), ends grants early:
// it expires a grant, hands the key to the next waiter and pushes the loss
// to the holder (which cancels its lease's context), but a holder in the
// middle of a write can still finish it. Fences still grow, so a resource
// that checks them (package fence) refuses the old holder. A follower's
// clock does not matter until it leads, and then every countdown restarts
// in full. A clock that runs slow makes expiry late, never early.
//
// dlock verify measures this with its store-clock-jump fault: dlockd's
// hidden --test-clock-offset-file (Config.TestClockOffsetFile, tests only)
// adds an offset, re-read every 10 ms, to the lease clock of one node, and
// the verifier moves the leader's 2 TTLs forward (docs/GUARANTEES.md).
//
// # Suspect leases
//
// Restarting every countdown in full on each new leader is safe, but if
// leaders change more often than a TTL, a dead holder's key is never freed
// (etcd's leases had this bug). So the leader watches for grants that stop
// being renewed:
//
//  1. A grant unrenewed for 2/5 of its TTL (clients renew every TTL/3)
//     becomes suspect. Under the clock's lock the leader marks it, reads
//     R = D − t_p, the time its countdown (deadline D) has left at that
//     moment t_p, and proposes a suspect entry (key, owner, grant version,
//     R); one entry carries every grant due at the same time.
//  2. From the mark on, the leader acknowledges no renewal of the grant
//     from memory: a renewal goes through the log (a TTL change with the
//     same TTL), which restarts the grant with a new version; its applied
//     entry is the only thing that clears the mark (a suspect entry whose
//     proposal failed or timed out may still commit later).
//  3. The FSM records R on the grant only if the entry names the grant's
//     current version (a logged renewal applied first makes it stale);
//     it does not change the version, so an expiry proposed for that
//     version stays valid. Snapshots keep it.
//  4. A new leader restarts a grant with a suspect entry at E + R, E being
//     when it takes up leadership, instead of E + TTL, and the grant stays
//     suspect (renewals through the log).
//  5. While a grant stays suspect, the leader logs its time left again every
//     TTL/8 (at least 50 ms apart): R' = D − t_q at t_q. So a chain of
//     short-lived leaders keeps making progress: each starts from the last
//     R logged. One leader must last 2/5 of a TTL to mark the grant, and
//     later ones TTL/8 each to move it forward; with a leader change every
//     TTL/2 a dead holder's key reaches the next waiter about 1.3 to 1.5
//     TTLs after its last renewal (tested), instead of never.
//
// No acknowledged renewal is missed. A client's validity ends at most at D,
// the deadline the leader held at t_p: renewals acknowledged before t_p
// already moved D (they took the clock's lock before the mark), and none is
// acknowledged from memory after it. Any leader that restores R holds the
// suspect entry, which was written after t_p, and so took up leadership
// after t_p (a leader never receives entries from others); it expires no
// earlier than E + R > t_p + R = D. The same holds for a checkpoint: R' =
// D − t_q, and nothing moved D since t_p. A leader that does not hold the
// entry restarts in full, safe by the argument of the previous section. Such
// a leader's in-memory renewals are not undone later by the entry it missed:
// a new leader acknowledges nothing (no renewal, no read) before it has
// committed an entry of its own term (becomeLeader's no-op), after which no
// entry of an earlier term that it does not hold can ever commit. A logged
// renewal after the suspect entry restarts the full TTL through the log,
// which every later leader holds.
// The model test TestLeaseClock_ModelNeverEndsAValidGrant checks this
// (random histories with restarts and failed suspect entries), and
// TestCluster_SuspectLeaseFreesUnderLeaderChurn the liveness.
//
// # Reads
//
// Inspect, List, CheckFence and refused tries are linearizable: the leader
// verifies its leadership (VerifyLeader), then waits until its FSM has
// applied the commit index it read after that. Concurrent reads and
// renewals share one VerifyLeader round (read index, Raft dissertation
// 6.4): a caller never joins a round already in flight, which may have
// started before it arrived, but waits for the next one, which starts when
// the running one ends and serves every caller that arrived meanwhile (64
// concurrent renewals on 3 nodes: one round per about 30 renewals;
// readindex.go). It writes nothing: a new
// leader's first entry the FSM sees is a no-op command (Raft's own no-op
// and barrier never reach the FSM), so the commit index is always one the
// FSM will reach.
//
// CheckFence answers Chubby's sequencer check, "is fence F the current grant
// of key K". It is weaker than a resource that stores the greatest fence it
// has seen (package fence): the grant can end right after the answer.
//
// # Waiters
//
// A waiter's queue entry lives in the FSM; its request waits on this node.
// When the request's context ends (the client cancelled, disconnected, or
// half-closed its Wait stream) the server proposes a cancel entry that
// removes the queue entry, or releases the grant if the key was handed to the
// waiter in the meantime. A client that vanished without closing its
// connection is found by gRPC keepalive pings within about 40 seconds (an
// HTTP client, when its connection breaks). A failed cancel (the node lost
// leadership at that moment) leaves the queue entry, or a grant that
// expires after its TTL.
//
// After a leader change (or a restart) the queue entries of clients not
// connected to the new leader keep their place for a grace period, the
// waiter's TTL from the new leader's election: a client that reconnects and
// waits again with the same key and owner token re-attaches to its entry
// (the FSM answers with its position, and records the entry's index as its
// since) and keeps its FIFO place. After its grace, an entry not
// re-attached is removed (a purge entry naming each entry's since as the
// new leader read it, so that an entry re-attached in the meantime is
// kept), only while the node is still the leader of the same term. A key
// handed over during the grace to a waiter that has not reconnected is
// governed by the claim window (see Claims), as any handover (grace.go).
//
// A retried acquisition by a holder's owner token (its answer was lost, or
// Locker.Resume from a restarted process) renews the grant through the log
// and, when it names a session, binds the grant to it, so that the grant's
// loss is pushed to the Watch stream of the process that holds it now.
//
// A Watch stream may also name keys (WatchRequest.keys, at most 100): it
// then hears CHANGED for each of them once per applied batch that made or
// ended a grant of it or started or ended its lock-delay (and for all of
// them after a restore). It is a hint to read the key again, as a
// ZooKeeper watch is (election.Observe uses it); a reader that falls
// behind is cut off with WATCH_BACKLOG_FULL, as for LOST.
//
// # Group commit
//
// Concurrent requests share one log write and one fsync: raft's
// BatchApplyCh collects up to Config.MaxAppendEntries entries per disk write,
// and the FSM applies them as one batch (raft.BatchingFSM). A request waits
// for no disk write but its own batch's.
//
// # Batching
//
// Commands are also batched into entries (propose.go, after the group
// commit of databases): one round of entries is in flight at a time; a
// command proposed while none is goes at once, alone, from its caller's
// goroutine, as the plain entry it always was (an idle server adds no
// wait); the commands proposed while a round is in flight, from all
// connections and the server's own loops, go together as the next round,
// in entries of at most 512 commands and 256 KiB. A batch entry (encoding
// version 4: opBatch, a count, then each command's plain encoding with its
// length) costs one raft.Apply, one future, one log record and one FSM
// call; the FSM decodes it whole (a malformed one is a bad command that
// changes nothing) and applies its commands in order under one lock, each
// with its own result for its caller.
//
// One kind of proposal waits for company: an acquisition with wait of a
// key that is held (it will most likely queue, and its caller waits for
// the holder's release anyway) does not start a round alone; it goes with
// the next proposal, or after 2 ms when none comes. Nor does it when it
// was proposed while a round was in flight: that round's end sends the
// queue only when it holds a proposal that does not wait (or a deferred
// one whose 2 ms ran out meanwhile). In a handoff loop the previous
// holder's new queue entry otherwise took an fsync of its own that the
// next release waited behind: two disk writes per handoff, now about one
// (BenchmarkHandoff's entries/handoff). A release, a try and a
// wait for a free key never wait; a queue entry is acknowledged only
// once committed, as before.
//
// Every command of a batch entry runs at the entry's index. That index is
// a grant version, a lock-delay version and a queue entry's since, and
// these stay sound: each is compared for equality with what a later
// command names (an expiry, a suspect mark, the end of a delay, an idle
// purge), and a later command is proposed only after the leader saw the
// entry applied, so it can only name the version the entry left last; two
// states that share an index inside one entry (a grant and its TTL
// change; a grant, its release and a new grant of the same key) are never
// both named, because the observer hears the entry's events in order and
// keeps the last. Commands that race in one entry (a renewal and an expiry
// proposed for the version before it) apply in the entry's order, as they
// would in two entries in that order. Fences do not use the index alone:
// the n-th grant of an entry gets max(index, lastFence+1), so fences stay
// unique server-wide and strictly increasing per key, across snapshots (v4
// snapshots keep lastFence when it is ahead of the applied index) and
// restarts (replay is deterministic). TestFSM_BatchSameKeyTwice and
// FuzzFSMApplyBatch check that a batch gives every command the result it
// would get in an entry of its own.
//
// Mixed versions. A member of a version before batching cannot decode a
// batch entry: it would answer it as a bad command, change nothing, and its
// table would part from the leader's. So the leader writes batch entries
// only while the Raft configuration has this node alone (the embedded
// default), or while every other member of the configuration says it
// decodes them, or when Config.Batching is BatchAlways (--batching on)
// (never when it is BatchNever, --batching off); otherwise a round is written as one plain entry per command (Raft
// still writes the round with one fsync). A member's version is not in the
// log, so the leader asks (batchgate.go): every second, and at once when
// it takes up leadership, it asks each other member of the configuration
// for its own status (Cluster.Status, local), whose batch_entries this
// version sets and earlier ones leave unset; it batches while every
// member answered so, naming the node ID and Raft address the
// configuration gives it, within the last 5 s, in the current term and
// configuration. A configuration changed since the last probe (a member
// added, or removed and added again), a new term, a member that does not
// answer (down, or an API address the leader cannot reach) or one that
// answers without batch_entries turns batching off at once, until a probe
// finds every member able again; nothing of it is replicated, so each new
// leader starts with batching off until its first probe. A rolling upgrade
// therefore needs nothing: the cluster batches once the last member runs
// this version. What the probe cannot cover: a member that joins must run
// this version or later when the log it replays already holds batch
// entries (as for a member joining a single node); and a cluster that has
// written batch entries cannot take back a member of a version before
// batching, in place or removed and added again, while its log still holds
// them (the member would replay or receive entries it skips). A downgrade
// below this version therefore takes three steps, and anything short of
// them is not supported: restart every member with --batching off (the
// leader then writes one entry per command; each member's /metrics says
// dlockd_raft_batching_mode{mode="off"}, and a leader's
// dlockd_raft_batching 0); wait until every member has
// taken a snapshot past the last batch entry (a restart replays only what
// follows its snapshot) and past the last fence issued (a batch's fences
// run ahead of the log index, and an earlier version may not carry on
// from a last fence ahead of it); then replace the members one at a
// time. The leader logs each change of its verdict ("batching on", or
// "batching off" naming the members that kept it off and why), and dlock
// cluster status prints it and each member's answer.
// From this version on, a member that meets a committed entry it cannot
// decode (a newer format, or corruption) does not skip it: it fails closed
// (Server.undecodable): it stops serving, answers UNAVAILABLE (DIVERGED),
// never takes up leadership, and reports ErrUndecodableEntry on Failed,
// on which dlockd exits. Older members cannot be taught this, hence the
// gate above.
//
// # API, limits and errors
//
// The service is proto/dlock/v1/dlock.proto. gRPC and HTTP/1.1 share the
// port: a connection that starts with the HTTP/2 preface goes to the gRPC
// server, anything else to the HTTP server (JSON routes under /v1/, /healthz,
// /readyz, /metrics). Errors are gRPC codes with a reason (INVALID_ARGUMENT
// 400, FAILED_PRECONDITION 409 for a held lock, NOT_FOUND 404 for a lost
// lease, RESOURCE_EXHAUSTED 429 or 413 for limits, UNAVAILABLE 503 when not
// the leader or shutting down). A request is validated whole before any
// proposal, so a malformed request never changes the state; a gRPC request
// whose bytes do not decode as the method's message is INVALID_ARGUMENT
// (INVALID_REQUEST), as malformed JSON is, never grpc-go's INTERNAL
// (decode.go). JSON requests
// ignore unknown fields, as protobuf does, for forward compatibility. A
// panic in a handler is recovered, logged with its stack and answered
// INTERNAL: no request can take the process down.
//
// A node that is not the leader answers NOT_LEADER (UNAVAILABLE, 503) with
// a leader hint: an errdetails.ErrorInfo detail {Reason NOT_LEADER, Domain
// dlockd, Metadata leader_id, leader_api} over gRPC, "leader" and
// "leader_id" fields and a Dlock-Leader header over HTTP (empty when no
// leader is known). It forwards unary Lock calls and /v1/ HTTP routes to
// the leader itself (marked dlock-forwarded: 1; a marked call is never
// forwarded again), so curl works against any member; Dlock-No-Forward: 1
// asks for a 307 to the leader instead. Session and Wait streams are not
// forwarded (NOT_LEADER with the hint at stream start); Watch is served by
// every node. A hint naming the node that answered means it is the leader
// catching up on its log: retry after a pause, never in a tight loop. See
// forward.go.
//
// Every resource a client can make the server hold is capped, each by a
// flag, and a refusal is counted in dlockd_limit_refusals_total{limit} and
// logged at info at most once per limit per 10 s: connections (one more is
// closed at once; Accept errors such as EMFILE are retried with backoff and
// never close the port), streams per connection (HTTP/2
// MAX_CONCURRENT_STREAMS), Session, Wait and Watch streams of the node
// (RESOURCE_EXHAUSTED, TOO_MANY_STREAMS), waiting requests of the node
// (TOO_MANY_WAITING_REQUESTS), queue entries per key and of the table
// (TOO_MANY_WAITERS), leases (TOO_MANY_LEASES), request size (413
// REQUEST_TOO_LARGE), the time to send an HTTP body (408 BODY_TIMEOUT; the
// deadline is cleared before a long-poll wait), and a Watch stream's unread
// events (the stream ends with WATCH_BACKLOG_FULL rather than drop a LOST
// event; the client reconnects, and its own deadlines keep it safe). A
// Session stream with MaxInflightPerStream calls, or
// MaxInflightBytesPerStream bytes of requests, running is not read until one
// is answered, and so is any stream while the node's MaxInflightBytes are
// taken; HTTP/2 flow control then pushes back on a client that pipelines
// without reading. Headers are bounded at 64 KiB, and a gRPC connection with
// no stream for 2 minutes is closed.
//
// Clients that make many calls use Session, one long-lived bidirectional
// stream per client that carries Acquire (without wait), Release and Renew
// calls matched by id, answered in any order: a call costs one small message
// each way instead of a new HTTP/2 stream (headers, trailers, a stream
// worker). Each call keeps the meaning of its unary RPC: it is answered
// after its log entry is committed and fsynced, and cancelling it (a cancel
// message, or the stream's end) undoes an acquisition as a unary call's
// cancellation does.
//
// # Transport
//
// Raft runs over a network transport (raft.NewNetworkTransportWithConfig)
// on Config.RaftBind (default 127.0.0.1:7451), also for a single node, with
// dlockd's own stream layer (raftnet.go): plain TCP on loopback, mutual TLS
// (TLS 1.3, both sides present a certificate of --peer-ca and verify the
// other's) when --peer-cert, --peer-key and --peer-ca are given, which is
// required when RaftBind is not a loopback address. Without it anyone who
// can reach the Raft port can send an AppendEntries with a huge term and
// depose the leader or rewrite a follower's log. The transport pools
// connections to each peer; a vote request (or a transfer's TimeoutNow)
// that meets one a peer's restart left dead is sent again on a new one
// (voteTransport), so that a candidate does not lose an election to its
// own stale connections.
//
// # Cluster
//
// A cluster starts from Config.InitialCluster (every voter, on every
// member's first start; restarts use the data directory's configuration),
// or grows with Config.Join: a node on an empty data directory asks a
// member to add it as a voter. The members registry in the FSM holds each
// member's API address (Config.Advertise), so that every node can tell
// clients where the leader's API is, and its incarnation (a random ID of
// its data directory). The Cluster service (gRPC, and JSON under
// /v1/cluster/) shows the members, the leader and the term, and adds,
// removes and transfers leadership, one membership change at a time. A
// member whose data directory was wiped is refused under its old ID until
// the old member is removed: it may have voted and acknowledged entries it
// no longer has (see cluster.go). A node started with --join keeps its Raft
// port shut until the leader agrees to add it; a node started with
// --initial-cluster on an empty data directory keeps it shut and first
// probes the other initial members on their Raft port (a first byte Raft
// never sends, over the same mutual TLS): it is refused when one of them
// records another incarnation under its ID; it bootstraps a new cluster
// only once every other initial member has answered without a log of its
// own (so a new cluster forms once all its members have started); and in
// a cluster that has run, it first registers with the leader and waits
// while there is none. What is left (cluster.go, bootstrapLoop): a member
// wiped after it voted or acknowledged but before its registration reached
// the members that answer is taken for a late first start, and once it
// takes part its vote is not fenced by term. A member removed with
// RemoveServer stays removed: its join is not repeated, its registration
// never adds a voter, and it shuts its Raft port when it sees its removal
// committed.
//
// # Authentication and audit
//
// With Config.AuthFile every call is authenticated (a bearer token, whose
// SHA-256 alone the file keeps, or a client certificate by subject CN or
// DNS SAN; another member by its peer certificate) and authorised per key
// prefix: lock, read, admin (auth.go). The check comes before anything
// else of a call, forwarding included: a follower refuses what the caller
// may not do before it forwards, and the leader checks again, with the
// identity the forwarding member names, so that a stale or compromised
// client cannot use a member's rights. A Session stream checks each call,
// and a Reload (SIGHUP) reaches streams already open: each call is checked
// against the rules in force. Admin actions and every refusal are written
// to the audit log (audit.go), never blocking a call for long. Without an
// auth file nothing changes: no identity, every call allowed.
package server
