package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// DefaultStoreURL is the store URL of a dlockd started with no flags.
const DefaultStoreURL = "dlockd://127.0.0.1:7450"

// Peer is another voter of the Raft cluster.
type Peer struct {
	// ID is the peer's node ID (Config.NodeID on that node).
	ID string
	// RaftAddr is the peer's Raft address, host:port.
	RaftAddr string
}

// Config configures one dlockd node. Start from DefaultConfig; the zero
// Config is not valid.
type Config struct {
	// NodeID names this node in the Raft configuration: 1 to 64 bytes of
	// A-Z a-z 0-9 '.' '_' '-' (see CheckNodeID). Default "dlockd-1".
	NodeID string
	// Listen is the host:port serving gRPC and JSON over HTTP on one port.
	// Port 0 picks a free port (see Server.Addr). Default "127.0.0.1:7450".
	Listen string
	// DataDir holds the Raft log, stable store and snapshots. Created when
	// missing. Default "./dlockd-data".
	DataDir string
	// RaftBind is the host:port of the Raft TCP transport. Port 0 picks a
	// free port (for tests and examples of a single node). Default
	// "127.0.0.1:7451".
	RaftBind string
	// RaftAdvertise is the Raft address other nodes use to reach this one.
	// Empty: this node's InitialCluster entry, which must then be RaftBind
	// (or, for a RaftBind on 0.0.0.0 or ::, have its port); without
	// InitialCluster, RaftBind (which must then not be an unspecified
	// address). Every address of a Config is host:port with a non-empty
	// host and a numeric port in 1..65535 (0 only in Listen and RaftBind).
	RaftAdvertise string
	// Advertise is the API address (host:port) clients and other members
	// use to reach this node; it is stored with the member in the
	// replicated members registry, so that every node can tell a client
	// where the leader's API is. Empty: the address the API listens on
	// (the bound address when Listen has port 0).
	Advertise string
	// InitialCluster lists every voter of the cluster's first start, this
	// node included (etcd's --initial-cluster): on a first start (an empty
	// data directory) the node bootstraps a Raft configuration of exactly
	// these voters. A restart ignores it: the data directory's
	// configuration wins. Empty (and no Join): a single voter, this node.
	// This node's entry is its Raft advertise address; it must equal
	// RaftAdvertise when that is set. Use it only for the first start of
	// a new cluster: a member whose data directory was lost is removed
	// (RemoveServer) and added again with Join.
	InitialCluster []Peer
	// Join is the API address (host:port) of any member of a running
	// cluster. On a first start the node starts with no Raft configuration
	// and asks that member (which forwards to the leader) to add it as a
	// voter, retrying with backoff until it is added or the server shuts
	// down. A restart ignores it. Exclusive with InitialCluster.
	Join string
	// PeerCertFile and PeerKeyFile are this node's certificate and key
	// (PEM) for mutual TLS on the Raft port, and PeerCAFile the CA
	// certificate(s) (PEM) every member's certificate is verified
	// against, both ways. All three or none. Required when RaftBind's host
	// is not a loopback address: the Raft port must accept only members
	// (a forged AppendEntries could otherwise depose a leader or rewrite
	// a follower's log).
	PeerCertFile, PeerKeyFile, PeerCAFile string
	// RaftDialRewrite is for tests only: when this node dials another
	// member's address K (its Raft address, or its API address to forward a
	// call, register or ask its status) it dials RaftDialRewrite[K] instead,
	// so that a test can put a proxy on each node-to-node link and a
	// partition cuts forwarding too. TLS still verifies the peer as K.
	RaftDialRewrite map[string]string
	// TestClockOffsetFile is for tests only: the lease clock (the
	// countdowns of grants, claims and lock-delays, see Expiry in the
	// package doc) reads this process's monotonic clock plus the offset the
	// file holds, a Go duration ("2s"), re-read every 10 ms. A fault
	// injector writes it to make this node's clock jump (dlock verify's
	// store-clock-jump). A missing file is an offset of 0.
	TestClockOffsetFile string

	// API TLS (issue 12).
	// TLSCertFile and TLSKeyFile are the certificate (chain) and key (PEM)
	// the API port serves: with them, gRPC and JSON over HTTP are served
	// over TLS (1.2 at least) on the one port, and nothing in clear. Both
	// or none. They are read at Start and again by Reload (SIGHUP), so a
	// rotated certificate is served without a restart.
	TLSCertFile, TLSKeyFile string
	// TLSClientCAFile is the CA certificate(s) (PEM) of client
	// certificates (mutual TLS): with it, every call of the API port must
	// come with a certificate that verifies against it, or against
	// PeerCAFile (other members), except /healthz, /readyz, /metrics and
	// the dashboard's static files (health checks and Prometheus present
	// none); a call without one is UNAUTHENTICATED (HTTP 401). A
	// certificate that does not verify fails the handshake. Without it,
	// client certificates are optional and only members' (PeerCAFile) are
	// verified. Needs TLSCertFile. It must not be (or contain) the peer
	// CA: client and identity certificates must never be issued by the
	// peer CA (see tls.go); Start logs a warning when it is.
	TLSClientCAFile string
	// TLSCAFile is the CA certificate(s) (PEM) this node verifies other
	// members' API certificates against when it forwards a call, joins or
	// asks a status. Empty: PeerCAFile.
	TLSCAFile string
	// InsecureListen allows a Listen address that is not loopback without
	// TLSCertFile: the API then answers anyone who reaches the port, in
	// clear. Default false: such a Listen is refused by Validate.
	InsecureListen bool

	// Authentication and audit (issue 12).
	// AuthFile is the auth file (YAML or JSON; see auth.go): token hashes
	// and client certificate identities, each with rules of key prefix to
	// permissions. Empty: no authentication, every caller may do
	// everything (as before). Read at Start (a bad file refuses to start)
	// and again by Reload (SIGHUP; a bad file keeps the rules in force).
	// With a cluster (InitialCluster of more than one member, or Join) it
	// needs peer TLS and API TLS: members authenticate each other's API
	// calls by their peer certificates.
	AuthFile string
	// AuditLogFile is the file the audit log (one JSON line per admin
	// action and per denial; see audit.go) is appended to. Empty: no audit
	// file (events are still counted in dlockd_audit_events_total).
	AuditLogFile string
	// AuditLogMaxBytes is the size in bytes past which the audit file is
	// rotated (renamed FILE.1, older ones shifted). Default 100 MiB.
	AuditLogMaxBytes int64
	// AuditLogMaxFiles is how many rotated audit files are kept besides
	// the live one. Default 10.
	AuditLogMaxFiles int

	// MaxKeyBytes is the longest key, in bytes. Default and maximum 512.
	MaxKeyBytes int
	// MinTTL and MaxTTL bound lease TTLs. Defaults 100ms and 24h; MaxTTL
	// at most 100 years.
	MinTTL, MaxTTL time.Duration
	// DefaultTTL is the TTL of a request that gives none. Default 30s.
	DefaultTTL time.Duration
	// MaxWaitersPerKey bounds each key's queue. Default 10,000.
	MaxWaitersPerKey int
	// MaxLeases bounds the held keys of the server. Default 1,000,000.
	MaxLeases int
	// MaxRequestBytes bounds one request (gRPC message or HTTP body).
	// Default 1 MiB.
	MaxRequestBytes int
	// MaxRenewBatch bounds the items of one renew request. Default 10,000.
	MaxRenewBatch int
	// MaxListLimit bounds the holders one list request returns. Default
	// 10,000; a request asking for 0 gets 1,000.
	MaxListLimit int

	// HeartbeatTimeout, ElectionTimeout and LeaderLeaseTimeout are the Raft
	// timings. Defaults 1s, 1s and 500ms. LeaderLeaseTimeout must be shorter
	// than HeartbeatTimeout (see the package doc on renewals).
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// CommitTimeout is Raft's commit timeout. Default 50ms.
	CommitTimeout time.Duration
	// MaxAppendEntries is how many entries Raft writes (and fsyncs) as one
	// batch: the group-commit size. Default 512, at most 1024.
	MaxAppendEntries int
	// SnapshotInterval and SnapshotThreshold: Raft checks every interval
	// and snapshots when more than threshold entries were appended, then
	// drops all but TrailingLogs entries from the log. Defaults 10s and
	// 16384.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	// TrailingLogs is how many entries are kept after a snapshot. Default
	// 10240.
	TrailingLogs uint64
	// Batching says when the leader writes several commands in one log
	// entry (a batch entry, encoding version 4): BatchAuto (the default,
	// also the zero value) batches on a single server always, and on the
	// leader of a cluster while every member of the Raft configuration
	// reports that it decodes batch entries (the leader asks every second;
	// see "Batching" in the package doc); BatchAlways batches in a cluster
	// whatever the members answer, for members whose status the leader
	// cannot read (an API address unreachable from it), and only when every
	// member runs a version that decodes batch entries (this one or later:
	// an earlier member cannot, and its lock table would part from the
	// leader's); BatchNever writes one entry per command, the first step of
	// a downgrade (see the package doc).
	Batching BatchMode
	// NoSync turns off fsync of the Raft log. Unsafe: a crash may lose
	// acknowledged grants and reissue fences. Default false; tests only.
	NoSync bool
	// legacyNoBatch makes the node stand in, for a test, for a member of
	// a version before batching: its status does not report that it
	// decodes batch entries, and as leader it never batches in a cluster.
	legacyNoBatch bool

	// ApplyTimeout bounds the wait for a proposal to be enqueued and
	// committed. Default 10s.
	ApplyTimeout time.Duration
	// ShutdownTimeout bounds a graceful shutdown before connections are cut.
	// Default 10s.
	ShutdownTimeout time.Duration

	// Pprof serves net/http/pprof under /debug/pprof/ on the API port.
	// Default false.
	Pprof bool

	// Lock-table safety settings (lock-delay, claim window, total waiters).
	// LockDelay is the default lock-delay (Chubby's and Consul's): after a
	// grant is lost without a release (expiry, force release), its key is
	// granted to nobody for this long, so that a paused holder's in-flight
	// writes land before the next holder starts. A request may set its own,
	// up to its TTL; the default is capped at each grant's TTL. Default 0
	// (none).
	LockDelay time.Duration
	// ClaimWindow is how long the receiver of a handed-over grant (a waiter
	// granted on a release or an expiry) has to confirm it with a renewal,
	// before the grant is released to the next waiter: a waiter that
	// vanished without closing its connection must not keep the key for a
	// whole TTL. Default 5s. The grant tells the waiter the window of the
	// node that answered it, and a client may act on the grant for that
	// long before its claim is acknowledged (driver.UnconfirmedWaiter), so
	// every member of a cluster must run the same window: to shorten it,
	// restart the members one by one with the new window only while no
	// client waits, or accept that a grant handed over during the change
	// may be passed on before its holder's validity ends.
	ClaimWindow time.Duration
	// MaxWaiters bounds the queue entries of the whole lock table. Default
	// 100,000.
	MaxWaiters int

	// Connection and stream limits (connections, streams, in-flight calls,
	// HTTP read deadlines). Each refusal is answered RESOURCE_EXHAUSTED
	// (gRPC) or 429 (HTTP) with a reason, unless said otherwise, counted in
	// dlockd_limit_refusals_total{limit} and logged at info, at most one
	// line per limit per 10s.

	// MaxConnections bounds the open connections of the API port, gRPC and
	// HTTP together. A connection beyond it is closed at once, before a
	// byte is read or written (limit "connections"): holding it would keep
	// its file descriptor, the very resource the cap protects, and the
	// client's reconnection backoff spaces out its retries. Default 10,000.
	MaxConnections int
	// MaxConnectionsPerIP bounds the open connections of the API port
	// from one source IP address (limit "connections_per_ip", refused as
	// MaxConnections refuses), so that one source cannot take every slot,
	// e.g. with idle sockets held through the TLS handshake window. 0: no
	// cap. Default 1,000.
	MaxConnectionsPerIP int
	// MaxStreamsPerConnection is the HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS
	// of gRPC connections: a client runs at most this many calls at once on
	// one connection and queues the others itself (grpc-go refuses excess
	// streams with REFUSED_STREAM; these are not counted). Default 1,024.
	MaxStreamsPerConnection int
	// MaxSessionStreams, MaxWaitStreams and MaxWatchStreams bound the open
	// Session, Wait and Watch streams of this node; one more is answered
	// RESOURCE_EXHAUSTED (TOO_MANY_STREAMS; limits "session_streams",
	// "wait_streams", "watch_streams"). Defaults 4,096 each.
	//
	// A client process (the dlockd driver) keeps one Session and one Watch
	// stream on the leader, so these defaults serve 4,096 client processes
	// per cluster. Every open stream holds goroutines parked in grpc-go's
	// frames for as long as it lives; measured on linux/amd64
	// (TestLoad_ParkedStreamStacks, stack + live heap): a Watch stream
	// about 8 + 3.6 KiB, a waiting Wait stream 12 + 5.6 KiB, an idle
	// Session stream 15 to 20 + 9.4 KiB. The Go GC's heap goal counts
	// stacks too, so under a burst of calls the process can reach about
	// twice what its streams hold. With these defaults, every limit reached
	// at once (4,096 Watch streams, 4,096 waiters on one key, a Session
	// stream pipelining 300,000 calls) peaks under 300 MiB RSS
	// (TestLoad_AbuseLeavesServerBoundedAndResponsive). Raise them with the
	// memory to match: 1,000 more of each of the three hold about 55 MiB,
	// up to twice that at a collection's peak.
	MaxSessionStreams, MaxWaitStreams, MaxWatchStreams int
	// MaxWaitingRequests bounds this node's acquisitions with wait in
	// flight: Wait streams and Acquire with wait, over gRPC or HTTP. One
	// more is answered RESOURCE_EXHAUSTED / 429 (TOO_MANY_WAITING_REQUESTS;
	// limit "waiting_requests"). MaxWaiters bounds the lock table's queue
	// entries; this bounds the requests (goroutines, streams) of this node.
	// Default 4,096 (see MaxSessionStreams for what each costs).
	MaxWaitingRequests int
	// MaxInflightPerStream bounds the calls of one Session stream that are
	// running or whose answer is not sent yet. When it is reached the
	// server stops reading that stream until a call is answered, and HTTP/2
	// flow control holds the client back (counted as limit
	// "session_inflight", nothing is refused). Default 256, at most 65,536.
	MaxInflightPerStream int
	// MaxSessionCallRate bounds the calls per second one Session stream
	// may make: the server reads a stream's next call no sooner than the
	// rate allows (in windows of at least a millisecond), and HTTP/2 flow
	// control holds the client back (counted as limit "session_rate",
	// nothing is refused). A client pipelining calls as fast as it can
	// otherwise keeps every core of the node busy with its calls, and
	// every other client's requests wait in the scheduler's queues behind
	// them: with 300,000 pipelined renewals an unrelated client's
	// acquisition p99 was 9 to 13 ms, 3 ms with this limit. 0: no limit.
	// Default 50,000 (a client process's calls share its Session stream:
	// above what a node grants in total today).
	MaxSessionCallRate int
	// MaxInflightBytes bounds the bytes of the Session calls of this node
	// that are running or whose answer is not sent yet, and
	// MaxInflightBytesPerStream those of one Session stream. A call weighs
	// its request's encoded size, at least 1 KiB. A stream whose next call
	// does not fit is not read until enough answers are sent, and HTTP/2
	// flow control holds its client back (counted as limits
	// "inflight_bytes" and "session_inflight_bytes", nothing is refused); a
	// call heavier than a budget waits until it is the only one in it.
	// MaxInflightPerStream alone let pipelined calls of up to
	// MaxRequestBytes each hold a gigabyte. Defaults 64 MiB and 4 MiB, at
	// least 1 KiB each.
	MaxInflightBytes, MaxInflightBytesPerStream int
	// MaxWatchBacklog bounds the loss events queued for one Watch stream
	// whose client does not read them. Beyond it the stream ends with
	// RESOURCE_EXHAUSTED (WATCH_BACKLOG_FULL; limit "watch_backlog") rather
	// than drop an event, and the client reconnects. Default 1,024 events.
	MaxWatchBacklog int
	// HTTPBodyTimeout bounds the reading of an HTTP request's body, counted
	// from the start of its handler; a slower body is answered 408
	// (DEADLINE_EXCEEDED, BODY_TIMEOUT; limit "http_body_timeout") and its
	// connection closed. A long-poll wait after the body is not bounded by
	// it. (Headers are bounded by 10s.) Default 10s.
	HTTPBodyTimeout time.Duration

	// Logging and observability settings.

	// Logger receives the server's logs, and Raft's (hashicorp/raft,
	// raft-wal and the Raft transport log through an hclog adapter into
	// Logger's handler), so one handler sets the format and the level of
	// everything. At info it logs start and stop, leader changes, keys
	// handed to waiters, grants that expired or were force-released or not
	// claimed, and refused requests (rate-limited); at debug, one line per
	// API call. A normal start of a single node logs no warning. Nil:
	// slog.Default().
	Logger *slog.Logger
	// RaftLogLevel overrides the level of Raft's lines alone: "trace",
	// "debug", "info", "warn", "error", or "off" to drop them. Default ""
	// (Raft follows Logger's level).
	RaftLogLevel string
	// RaftLogOutput, when set, receives Raft's lines as slog text instead of
	// Logger, at RaftLogLevel (or at Logger's level). Default nil.
	RaftLogOutput io.Writer
}

// DefaultConfig returns the configuration of a dlockd started with no flags:
// one voter on 127.0.0.1:7450 with its data in ./dlockd-data.
func DefaultConfig() Config {
	return Config{
		NodeID:             "dlockd-1",
		Listen:             "127.0.0.1:7450",
		DataDir:            "./dlockd-data",
		RaftBind:           "127.0.0.1:7451",
		MaxKeyBytes:        512,
		MinTTL:             100 * time.Millisecond,
		MaxTTL:             24 * time.Hour,
		DefaultTTL:         30 * time.Second,
		MaxWaitersPerKey:   10000,
		MaxLeases:          1000000,
		MaxWaiters:         100000,
		ClaimWindow:        5 * time.Second,
		MaxRequestBytes:    1 << 20,
		MaxRenewBatch:      10000,
		MaxListLimit:       10000,
		AuditLogMaxBytes:   100 << 20, // authentication and audit (issue 12)
		AuditLogMaxFiles:   10,
		HeartbeatTimeout:   time.Second,
		ElectionTimeout:    time.Second,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		MaxAppendEntries:   512,
		SnapshotInterval:   10 * time.Second,
		SnapshotThreshold:  16384,
		TrailingLogs:       10240,
		ApplyTimeout:       10 * time.Second,
		ShutdownTimeout:    10 * time.Second,

		// Connection and stream limits.
		MaxConnections:          10000,
		MaxConnectionsPerIP:     1000,
		MaxStreamsPerConnection: 1024,
		MaxSessionStreams:       4096,
		MaxWaitStreams:          4096,
		MaxWatchStreams:         4096,
		MaxWaitingRequests:      4096,
		MaxInflightPerStream:    256,
		MaxSessionCallRate:      50000,
		MaxWatchBacklog:         1024,
		HTTPBodyTimeout:         10 * time.Second,

		MaxInflightBytes:          64 << 20,
		MaxInflightBytesPerStream: 4 << 20,
	}
}

// maxTTLBound is the longest MaxTTL: log entries hold durations up to 2^62
// ns (about 146 years; a longer TTL was written, failed to decode when
// applied and was answered INTERNAL), and countdowns add TTLs to int64
// nanoseconds.
const maxTTLBound = 100 * 365 * 24 * time.Hour

// Validate reports every problem of c joined in one error, or nil.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("dlockd: config: "+format, a...)) }
	if err := CheckNodeID(c.NodeID); err != nil {
		bad("NodeID: %v", err)
	}
	if err := checkHostPort(c.Listen, true); err != nil {
		bad("Listen %q: %v", c.Listen, err)
	}
	if c.DataDir == "" {
		bad("DataDir is empty")
	}
	if err := checkHostPort(c.RaftBind, true); err != nil {
		bad("RaftBind %q: %v", c.RaftBind, err)
	}
	if c.RaftAdvertise != "" {
		if err := checkDialAddr(c.RaftAdvertise); err != nil {
			bad("RaftAdvertise %q: %v", c.RaftAdvertise, err)
		}
	}
	errs = append(errs, c.validateCluster()...)
	if err := c.Batching.check(); err != nil {
		bad("Batching: %v", err)
	}
	errs = append(errs, c.validateTLS()...)  // API TLS (issue 12)
	errs = append(errs, c.validateAuth()...) // authentication and audit (issue 12, auth.go)
	if c.MaxKeyBytes < 1 || c.MaxKeyBytes > 512 {
		bad("MaxKeyBytes %d outside [1, 512]", c.MaxKeyBytes)
	}
	if c.MinTTL <= 0 || c.MaxTTL < c.MinTTL {
		bad("TTL range [%v, %v] is empty or not positive", c.MinTTL, c.MaxTTL)
	}
	if c.MaxTTL > maxTTLBound {
		bad("MaxTTL %v above %v (100 years)", c.MaxTTL, maxTTLBound)
	}
	if c.DefaultTTL < c.MinTTL || c.DefaultTTL > c.MaxTTL {
		bad("DefaultTTL %v outside [%v, %v]", c.DefaultTTL, c.MinTTL, c.MaxTTL)
	}
	if c.MaxWaitersPerKey < 0 {
		bad("MaxWaitersPerKey %d is negative", c.MaxWaitersPerKey)
	}
	if c.LockDelay < 0 || c.LockDelay > c.MaxTTL {
		bad("LockDelay %v outside [0, MaxTTL %v]", c.LockDelay, c.MaxTTL)
	}
	if c.ClaimWindow < c.MinTTL || c.ClaimWindow > time.Hour {
		bad("ClaimWindow %v outside [MinTTL %v, 1h]", c.ClaimWindow, c.MinTTL)
	}
	if c.MaxWaiters < 1 {
		bad("MaxWaiters %d < 1", c.MaxWaiters)
	}
	if c.MaxLeases < 1 {
		bad("MaxLeases %d < 1", c.MaxLeases)
	}
	if c.MaxRequestBytes < 1024 {
		bad("MaxRequestBytes %d < 1024", c.MaxRequestBytes)
	}
	if c.MaxRenewBatch < 1 {
		bad("MaxRenewBatch %d < 1", c.MaxRenewBatch)
	}
	if c.MaxListLimit < 1 {
		bad("MaxListLimit %d < 1", c.MaxListLimit)
	}
	if c.MaxConnections < 1 {
		bad("MaxConnections %d < 1", c.MaxConnections)
	}
	if c.MaxConnectionsPerIP < 0 {
		bad("MaxConnectionsPerIP %d < 0 (0: no cap)", c.MaxConnectionsPerIP)
	}
	if c.MaxStreamsPerConnection < 1 || c.MaxStreamsPerConnection > 1<<31-1 {
		bad("MaxStreamsPerConnection %d outside [1, 2^31-1]", c.MaxStreamsPerConnection)
	}
	if c.MaxSessionStreams < 1 || c.MaxWaitStreams < 1 || c.MaxWatchStreams < 1 {
		bad("MaxSessionStreams %d, MaxWaitStreams %d and MaxWatchStreams %d must be at least 1", c.MaxSessionStreams, c.MaxWaitStreams, c.MaxWatchStreams)
	}
	if c.MaxWaitingRequests < 1 {
		bad("MaxWaitingRequests %d < 1", c.MaxWaitingRequests)
	}
	if c.MaxInflightPerStream < 1 || c.MaxInflightPerStream > 65536 {
		bad("MaxInflightPerStream %d outside [1, 65536]", c.MaxInflightPerStream)
	}
	if c.MaxSessionCallRate < 0 {
		bad("MaxSessionCallRate %d < 0 (0: no limit)", c.MaxSessionCallRate)
	}
	if c.MaxInflightBytes < 1024 || c.MaxInflightBytesPerStream < 1024 {
		bad("MaxInflightBytes %d and MaxInflightBytesPerStream %d must be at least 1024", c.MaxInflightBytes, c.MaxInflightBytesPerStream)
	}
	if c.MaxWatchBacklog < 1 {
		bad("MaxWatchBacklog %d < 1", c.MaxWatchBacklog)
	}
	if c.HTTPBodyTimeout <= 0 {
		bad("HTTPBodyTimeout %v is not positive", c.HTTPBodyTimeout)
	}
	if c.HeartbeatTimeout <= 0 || c.ElectionTimeout <= 0 || c.LeaderLeaseTimeout <= 0 || c.CommitTimeout <= 0 {
		bad("Raft timeouts must be positive")
	}
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		bad("LeaderLeaseTimeout %v > HeartbeatTimeout %v", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.MaxAppendEntries < 1 || c.MaxAppendEntries > 1024 {
		bad("MaxAppendEntries %d outside [1, 1024]", c.MaxAppendEntries)
	}
	if c.SnapshotInterval <= 0 || c.SnapshotThreshold == 0 {
		bad("SnapshotInterval and SnapshotThreshold must be positive")
	}
	if c.ApplyTimeout <= 0 || c.ShutdownTimeout <= 0 {
		bad("ApplyTimeout and ShutdownTimeout must be positive")
	}
	switch c.RaftLogLevel {
	case "", "trace", "debug", "info", "warn", "error", "off":
	default:
		bad("RaftLogLevel %q is not one of trace, debug, info, warn, error, off (or empty: follow Logger)", c.RaftLogLevel)
	}
	return errors.Join(errs...)
}

// RegisterFlags defines one GNU-style flag (--name) for every setting an
// operator may change, writing into c; c's current values are the defaults
// shown in --help. cmd/dlockd calls it; an embedding program may too.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "host:port serving gRPC and JSON over HTTP (port 0: a free port)")
	fs.StringVar(&c.DataDir, "data", c.DataDir, "directory of the Raft log and snapshots")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "Raft node ID: 1 to 64 bytes of A-Z a-z 0-9 . _ -")
	fs.StringVar(&c.RaftBind, "raft-bind", c.RaftBind, "host:port of the Raft transport (port 0: a free port)")
	fs.StringVar(&c.RaftAdvertise, "raft-advertise", c.RaftAdvertise, "Raft address other nodes dial (default: with --initial-cluster, this node's entry there, which must then be --raft-bind, or --raft-bind's port on a 0.0.0.0 bind; without, --raft-bind)")
	fs.StringVar(&c.Advertise, "advertise", c.Advertise, "API address (host:port) clients and other members use to reach this node (default: --listen)")
	fs.Var(peersFlag{&c.InitialCluster}, "initial-cluster", "every voter of the cluster's first start, this node included: id=raft-host:port,... (ignored once the data dir has state)")
	fs.StringVar(&c.Join, "join", c.Join, "API address (host:port) of a member of a running cluster to join as a voter on first start")
	fs.StringVar(&c.PeerCertFile, "peer-cert", c.PeerCertFile, "this node's certificate (PEM) for mutual TLS on the Raft port (required with --peer-key and --peer-ca when --raft-bind is not a loopback address)")
	fs.StringVar(&c.PeerKeyFile, "peer-key", c.PeerKeyFile, "this node's private key (PEM) for mutual TLS on the Raft port (required when --raft-bind is not a loopback address)")
	fs.StringVar(&c.PeerCAFile, "peer-ca", c.PeerCAFile, "CA certificate(s) (PEM) that members' Raft certificates are verified against (required when --raft-bind is not a loopback address); re-read on SIGHUP. Issue only node certificates from it: one whose CN is a node ID is a cluster member on the API, and one may join the cluster under its CN; never client or identity certificates")
	// API TLS (issue 12).
	fs.StringVar(&c.TLSCertFile, "tls-cert", c.TLSCertFile, "certificate (PEM) of the API port: serve gRPC and HTTP over TLS (with --tls-key; re-read on SIGHUP)")
	fs.StringVar(&c.TLSKeyFile, "tls-key", c.TLSKeyFile, "private key (PEM) of --tls-cert")
	fs.StringVar(&c.TLSClientCAFile, "tls-client-ca", c.TLSClientCAFile, "CA certificate(s) (PEM) of client certificates: require one on every API call but /healthz, /readyz, /metrics and /ui/ static files (mutual TLS; members' --peer-ca certificates are accepted too); re-read on SIGHUP. Must not be --peer-ca's CA: client and identity certificates must never be issued by the peer CA")
	fs.StringVar(&c.TLSCAFile, "tls-ca", c.TLSCAFile, "CA certificate(s) (PEM) that other members' API certificates are verified against (default: --peer-ca)")
	fs.BoolVar(&c.InsecureListen, "insecure-listen", c.InsecureListen, "allow a --listen that is not loopback without --tls-cert (the API is then open to the network in clear)")
	// Authentication and audit (issue 12).
	fs.StringVar(&c.AuthFile, "auth-file", c.AuthFile, "auth file (YAML or JSON): token hashes and certificate identities with per-prefix permissions (lock, read, admin); re-read on SIGHUP. Empty: no authentication")
	fs.StringVar(&c.AuditLogFile, "audit-log", c.AuditLogFile, "append one JSON line per admin action and per denial to this file")
	fs.Int64Var(&c.AuditLogMaxBytes, "audit-log-max-bytes", c.AuditLogMaxBytes, "rotate the audit log past this size, bytes")
	fs.IntVar(&c.AuditLogMaxFiles, "audit-log-max-files", c.AuditLogMaxFiles, "rotated audit log files kept")
	fs.Var(rewriteFlag{&c.RaftDialRewrite}, "test-raft-dial-rewrite", "tests only: when Raft dials K, dial V instead (K=V,...)")
	_ = fs.MarkHidden("test-raft-dial-rewrite")
	fs.StringVar(&c.TestClockOffsetFile, "test-clock-offset-file", c.TestClockOffsetFile, "tests only: the lease clock adds the Go duration this file holds (re-read every 10 ms) to the monotonic clock")
	_ = fs.MarkHidden("test-clock-offset-file")
	fs.IntVar(&c.MaxWaitersPerKey, "max-waiters-per-key", c.MaxWaitersPerKey, "queue length limit per key")
	fs.IntVar(&c.MaxLeases, "max-leases", c.MaxLeases, "held keys limit of the server")
	fs.IntVar(&c.MaxRequestBytes, "max-request-bytes", c.MaxRequestBytes, "request size limit, bytes")
	fs.DurationVar(&c.MinTTL, "min-ttl", c.MinTTL, "shortest lease TTL")
	fs.DurationVar(&c.MaxTTL, "max-ttl", c.MaxTTL, "longest lease TTL")
	fs.DurationVar(&c.DefaultTTL, "default-ttl", c.DefaultTTL, "TTL of requests that give none")
	fs.DurationVar(&c.HeartbeatTimeout, "raft-heartbeat-timeout", c.HeartbeatTimeout, "Raft heartbeat timeout")
	fs.DurationVar(&c.ElectionTimeout, "raft-election-timeout", c.ElectionTimeout, "Raft election timeout")
	fs.DurationVar(&c.LeaderLeaseTimeout, "raft-leader-lease-timeout", c.LeaderLeaseTimeout, "Raft leader lease timeout (< heartbeat timeout)")
	fs.DurationVar(&c.SnapshotInterval, "snapshot-interval", c.SnapshotInterval, "how often Raft checks whether to snapshot")
	fs.Uint64Var(&c.SnapshotThreshold, "snapshot-threshold", c.SnapshotThreshold, "log entries since the last snapshot that trigger one")
	fs.StringVar(&c.RaftLogLevel, "raft-log-level", c.RaftLogLevel, "Raft log level: trace, debug, info, warn, error, off (default: follow --log-level)")
	fs.BoolVar(&c.NoSync, "unsafe-no-fsync", c.NoSync, "do not fsync the Raft log (tests and benchmarks only: a crash can lose acknowledged grants and reissue fences)")
	fs.Var(batchModeFlag{&c.Batching}, "batching", "when the leader writes several commands per Raft log entry: auto (a single server always, a cluster while every member reports that it decodes them), on (in a cluster whatever members report: only when every member runs a version that decodes batch entries), off (one entry per command: the first step of a downgrade)")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "serve net/http/pprof under /debug/pprof/ on the API port")
	// Lock-table safety settings.
	fs.DurationVar(&c.LockDelay, "lock-delay", c.LockDelay, "after a grant is lost without a release, grant its key to nobody for this long (a request may set its own, up to its TTL)")
	fs.DurationVar(&c.ClaimWindow, "claim-window", c.ClaimWindow, "a waiter handed a key must confirm the grant (renew) within this, or it goes to the next waiter; run every member with the same window")
	fs.IntVar(&c.MaxWaiters, "max-waiters", c.MaxWaiters, "queue entries limit of the server")

	// Connection and stream limits.
	fs.IntVar(&c.MaxConnections, "max-connections", c.MaxConnections, "open connections limit of the API port; more are closed at once")
	fs.IntVar(&c.MaxConnectionsPerIP, "max-connections-per-ip", c.MaxConnectionsPerIP, "open connections limit of the API port from one source IP address (0: no cap); more are closed at once")
	fs.IntVar(&c.MaxStreamsPerConnection, "max-streams-per-connection", c.MaxStreamsPerConnection, "concurrent gRPC streams limit per connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)")
	fs.IntVar(&c.MaxSessionStreams, "max-session-streams", c.MaxSessionStreams, "open Session streams limit of the server")
	fs.IntVar(&c.MaxWaitStreams, "max-wait-streams", c.MaxWaitStreams, "open Wait streams limit of the server")
	fs.IntVar(&c.MaxWatchStreams, "max-watch-streams", c.MaxWatchStreams, "open Watch streams limit of the server")
	fs.IntVar(&c.MaxWaitingRequests, "max-waiting-requests", c.MaxWaitingRequests, "acquisitions with wait in flight limit of the server (Wait streams, gRPC and HTTP)")
	fs.IntVar(&c.MaxInflightPerStream, "max-inflight-per-stream", c.MaxInflightPerStream, "calls in flight per Session stream; beyond, the server stops reading the stream")
	fs.IntVar(&c.MaxSessionCallRate, "max-session-call-rate", c.MaxSessionCallRate, "calls per second per Session stream; beyond, the server reads the stream more slowly (0: no limit)")
	fs.IntVar(&c.MaxInflightBytes, "max-inflight-bytes", c.MaxInflightBytes, "bytes of Session calls in flight on the server (request sizes, at least 1 KiB a call); beyond, streams are not read")
	fs.IntVar(&c.MaxInflightBytesPerStream, "max-inflight-bytes-per-stream", c.MaxInflightBytesPerStream, "bytes of calls in flight per Session stream; beyond, the server stops reading the stream")
	fs.IntVar(&c.MaxWatchBacklog, "max-watch-backlog", c.MaxWatchBacklog, "unread loss events per Watch stream; beyond, the stream ends so the client reconnects")
	fs.DurationVar(&c.HTTPBodyTimeout, "http-body-timeout", c.HTTPBodyTimeout, "time limit for reading an HTTP request body (not the wait that follows)")

	// Logging and observability settings.
}

// validateCluster checks the cluster settings: Advertise, InitialCluster,
// Join, the peer TLS files and RaftDialRewrite.
func (c Config) validateCluster() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("dlockd: config: "+format, a...)) }
	if c.Advertise != "" {
		if err := checkDialAddr(c.Advertise); err != nil {
			bad("Advertise %q: %v", c.Advertise, err)
		}
	}
	clustered := c.Join != "" || len(c.InitialCluster) > 1
	if clustered && c.Advertise == "" {
		if host, _, err := net.SplitHostPort(c.Listen); err == nil && unspecifiedHost(host) {
			bad("Listen %q is not an address other members and clients can dial: set Advertise (--advertise HOST:PORT)", c.Listen)
		}
	}
	if len(c.InitialCluster) > 0 {
		ids := make(map[string]bool, len(c.InitialCluster))
		addrs := make(map[string]string, len(c.InitialCluster))
		self := false
		for _, p := range c.InitialCluster {
			if p.ID == "" {
				bad("InitialCluster: a member has an empty ID (want id=host:port)")
				continue
			}
			if err := CheckNodeID(p.ID); err != nil {
				bad("InitialCluster: member %q: %v", p.ID, err)
			}
			if ids[p.ID] {
				bad("InitialCluster: node ID %q appears twice", p.ID)
			}
			ids[p.ID] = true
			if err := checkDialAddr(p.RaftAddr); err != nil {
				bad("InitialCluster: member %q: Raft address %q: %v", p.ID, p.RaftAddr, err)
			} else if other, dup := addrs[p.RaftAddr]; dup {
				bad("InitialCluster: members %q and %q have the same Raft address %s", other, p.ID, p.RaftAddr)
			} else {
				addrs[p.RaftAddr] = p.ID
			}
			if p.ID == c.NodeID {
				self = true
				if c.RaftAdvertise != "" && c.RaftAdvertise != p.RaftAddr {
					bad("InitialCluster gives this node (%q) the Raft address %s, but RaftAdvertise is %s: they must be the same", p.ID, p.RaftAddr, c.RaftAdvertise)
				} else if c.RaftAdvertise == "" && !bindServes(c.RaftBind, p.RaftAddr) {
					bad("InitialCluster gives this node (%q) the Raft address %s, but RaftBind is %s and RaftAdvertise is not set: the other members would dial %s and find nothing; make --raft-bind %s (or bind 0.0.0.0 on its port), or set --raft-advertise", p.ID, p.RaftAddr, c.RaftBind, p.RaftAddr, p.RaftAddr)
				}
			}
		}
		if !self {
			bad("InitialCluster does not include this node (NodeID %q): list every voter, this node included, as id=host:port", c.NodeID)
		}
	}
	if c.Join != "" {
		if len(c.InitialCluster) > 0 {
			bad("Join and InitialCluster are exclusive: a new cluster starts with --initial-cluster, a node joins a running one with --join")
		}
		if err := checkDialAddr(c.Join); err != nil {
			bad("Join %q: %v", c.Join, err)
		}
	}
	nTLS := 0
	for _, f := range []string{c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile} {
		if f != "" {
			nTLS++
		}
	}
	if nTLS != 0 && nTLS != 3 {
		bad("peer TLS needs all three of PeerCertFile, PeerKeyFile and PeerCAFile (--peer-cert, --peer-key, --peer-ca), or none")
	}
	if host, _, err := net.SplitHostPort(c.RaftBind); err == nil && nTLS == 0 && !loopbackHost(host) {
		bad("RaftBind %q is not a loopback address: the Raft port must speak mutual TLS (--peer-cert, --peer-key, --peer-ca), or bind to 127.0.0.1", c.RaftBind)
	}
	for k, v := range c.RaftDialRewrite {
		if err := checkHostPort(k, false); err != nil {
			bad("RaftDialRewrite key %q: %v", k, err)
		}
		if err := checkHostPort(v, false); err != nil {
			bad("RaftDialRewrite value %q: %v", v, err)
		}
	}
	return errs
}

// checkDialAddr reports whether addr is a host:port another machine can
// dial: a host that is not empty nor unspecified, and a port in 1..65535.
func checkDialAddr(addr string) error {
	if err := checkHostPort(addr, false); err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(addr)
	if unspecifiedHost(host) {
		return fmt.Errorf("host %q cannot be dialed (give the address others reach this node at)", host)
	}
	return nil
}

// checkHostPort reports whether addr is host:port with a non-empty host
// and a numeric port in 1..65535, or 0 when zeroOK (a listen address that
// may pick a free port).
func checkHostPort(addr string, zeroOK bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("host is empty (want host:port, e.g. 127.0.0.1:7450)")
	}
	n, err := strconv.ParseUint(port, 10, 32)
	switch {
	case err != nil || port == "":
		return fmt.Errorf("port %q is not a number", port)
	case n == 0 && !zeroOK:
		return errors.New("port is missing or 0")
	case n > 65535:
		return fmt.Errorf("port %d is outside 1..65535", n)
	}
	return nil
}

// bindServes reports whether a Raft transport bound to bind is reached at
// adv: the same address, or, for a bind to an unspecified host (0.0.0.0,
// ::), the same port (the node then advertises adv).
func bindServes(bind, adv string) bool {
	if bind == adv {
		return true
	}
	bh, bp, err1 := net.SplitHostPort(bind)
	_, ap, err2 := net.SplitHostPort(adv)
	return err1 == nil && err2 == nil && bh != "" && unspecifiedHost(bh) && bp == ap
}

// maxNodeIDBytes is the longest node ID.
const maxNodeIDBytes = 64

// CheckNodeID returns nil when id is a valid node ID: 1 to 64 bytes of
// ASCII letters, digits, '.', '_' and '-' (so that it can be written in
// --initial-cluster, in a URL and as a command-line argument), else an
// error saying what is wrong.
func CheckNodeID(id string) error {
	if id == "" || len(id) > maxNodeIDBytes {
		return fmt.Errorf("node ID %q: want 1 to %d bytes, got %d", id, maxNodeIDBytes, len(id))
	}
	for i := 0; i < len(id); i++ {
		b := id[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '-') {
			return fmt.Errorf("node ID %q: byte %q at %d is not one of A-Z a-z 0-9 . _ -", id, b, i)
		}
	}
	return nil
}

// unspecifiedHost reports whether host is empty or 0.0.0.0 or ::.
func unspecifiedHost(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// loopbackHost reports whether host is localhost or a loopback IP.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ParseInitialCluster parses the --initial-cluster form
// "id=host:port,id=host:port" (etcd's). An empty string is no members.
// It returns an error for an element without "=".
func ParseInitialCluster(s string) ([]Peer, error) {
	var out []Peer
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, el := range strings.Split(s, ",") {
		el = strings.TrimSpace(el)
		id, addr, ok := strings.Cut(el, "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("initial cluster member %q: want id=host:port", el)
		}
		out = append(out, Peer{ID: id, RaftAddr: addr})
	}
	return out, nil
}

// FormatInitialCluster is the inverse of ParseInitialCluster.
func FormatInitialCluster(peers []Peer) string {
	parts := make([]string, len(peers))
	for i, p := range peers {
		parts[i] = p.ID + "=" + p.RaftAddr
	}
	return strings.Join(parts, ",")
}

// peersFlag is the pflag.Value of --initial-cluster.
type peersFlag struct{ p *[]Peer }

func (f peersFlag) String() string { return FormatInitialCluster(*f.p) }
func (f peersFlag) Type() string   { return "id=host:port,..." }
func (f peersFlag) Set(s string) error {
	peers, err := ParseInitialCluster(s)
	if err != nil {
		return err
	}
	*f.p = peers
	return nil
}

// BatchMode is Config.Batching: when the leader writes batch entries.
type BatchMode string

// The batch modes (Config.Batching, dlockd --batching).
const (
	// BatchAuto batches on a single server, and in a cluster while every
	// member reports that it decodes batch entries. "" means it too.
	BatchAuto BatchMode = "auto"
	// BatchAlways batches in a cluster whatever its members report.
	BatchAlways BatchMode = "on"
	// BatchNever writes one log entry per command.
	BatchNever BatchMode = "off"
)

// check returns an error naming the modes when m is none of them (in any
// case, spaces around it ignored).
func (m BatchMode) check() error {
	switch m.normal() {
	case BatchAuto, BatchAlways, BatchNever:
		return nil
	}
	return fmt.Errorf("%q is not a batch mode (auto, on or off)", string(m))
}

// normal returns m in lower case without surrounding spaces, "" as
// BatchAuto.
func (m BatchMode) normal() BatchMode {
	n := BatchMode(strings.ToLower(strings.TrimSpace(string(m))))
	if n == "" {
		return BatchAuto
	}
	return n
}

type batchModeFlag struct{ m *BatchMode }

func (f batchModeFlag) String() string {
	if *f.m == "" {
		return string(BatchAuto)
	}
	return string(*f.m)
}
func (f batchModeFlag) Type() string { return "auto|on|off" }
func (f batchModeFlag) Set(s string) error {
	if strings.TrimSpace(s) == "" { // "" means auto in a Config, but an empty flag is a mistake
		return fmt.Errorf("%q is not a batch mode (auto, on or off)", s)
	}
	m := BatchMode(s)
	if err := m.check(); err != nil {
		return err
	}
	*f.m = m.normal()
	return nil
}

// rewriteFlag is the pflag.Value of --test-raft-dial-rewrite.
type rewriteFlag struct{ m *map[string]string }

func (f rewriteFlag) String() string {
	var parts []string
	for k, v := range *f.m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}
func (f rewriteFlag) Type() string { return "from=to,..." }
func (f rewriteFlag) Set(s string) error {
	m := make(map[string]string)
	for _, el := range strings.Split(s, ",") {
		if el = strings.TrimSpace(el); el == "" {
			continue
		}
		k, v, ok := strings.Cut(el, "=")
		if !ok || k == "" || v == "" {
			return fmt.Errorf("dial rewrite %q: want from-host:port=to-host:port", el)
		}
		m[k] = v
	}
	*f.m = m
	return nil
}
