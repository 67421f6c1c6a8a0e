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
// The fence of a grant is the Raft log index of the entry that made it, so
// a key's fences are strictly increasing, never reused, and survive
// restarts. Fences of different keys are not comparable and may be equal:
// one entry (an expiry or unclaimed release of several keys) hands each key
// to its head waiter with the entry's index.
//
// A release, an expiry or a cancelled grant hands the key to the head waiter
// in the same log entry, and the waiter's request is answered when that entry
// is applied: no polling, no herd, FIFO. Each key's queue is a doubly linked
// list with an index by owner token, so enqueue, handover and the cancel of
// any entry cost O(1) however long the queue (a slice used to be copied on
// every cancel: 10,000 cancels allocated gigabytes and stalled the FSM).
// Held keys are also kept in an ordered index (a B-tree), so a List page
// costs the page, not the table, and pages follow with a page token.
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
// wait, before the grant, and it acts only once the claiming renewal is
// acknowledged; a renewal arriving after the claim deadline is refused, as
// the release may already be proposed. A new leader cannot know whether a
// claim reached its predecessor, so it treats every grant as claimed
// (late, never early).
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
// then restarts every countdown at its grant's full TTL: expiry can come late,
// never early.
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
// is immediate (VerifyLeader answers at once with a quorum of one) and step 3
// is moot. The partitioned-old-leader case needs a cluster, which arrives with
// the multi-node issue; it is not tested yet.
//
// # Reads
//
// Inspect, List, CheckFence and refused tries are linearizable: the leader
// verifies its leadership (VerifyLeader), then waits until its FSM has
// applied the commit index it read after that. It writes nothing: a new
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
// HTTP client, when its connection breaks). A new leader removes the queue
// entries of clients
// that are not connected to it (after a restart: all of them). A failed
// cancel (the node lost leadership at that moment) leaves a grant that
// expires after its TTL.
//
// # Group commit
//
// Every request is one Raft entry; concurrent requests share one log write
// and one fsync: raft's BatchApplyCh collects up to Config.MaxAppendEntries
// proposals per disk write, and the FSM applies them as one batch
// (raft.BatchingFSM). A request waits for no disk write but its own batch's.
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
// proposal, so a malformed request never changes the state. JSON requests
// ignore unknown fields, as protobuf does, for forward compatibility. A
// panic in a handler is recovered, logged with its stack and answered
// INTERNAL: no request can take the process down.
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
// Raft runs over raft.NewTCPTransport on Config.RaftBind (default
// 127.0.0.1:7451), also for a single node, so that the same code path will
// carry a cluster. Only a single voter is supported in this version.
package server
