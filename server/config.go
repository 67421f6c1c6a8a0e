package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
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
	// NodeID names this node in the Raft configuration. Default "dlockd-1".
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
	// Empty: RaftBind (which must then not be an unspecified address).
	RaftAdvertise string
	// Peers are the other voters. Only a single node (no peers) is
	// supported in this version; Validate rejects peers.
	Peers []Peer

	// MaxKeyBytes is the longest key, in bytes. Default and maximum 512.
	MaxKeyBytes int
	// MinTTL and MaxTTL bound lease TTLs. Defaults 100ms and 24h.
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
	// NoSync turns off fsync of the Raft log. Unsafe: a crash may lose
	// acknowledged grants and reissue fences. Default false; tests only.
	NoSync bool

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

	// Connection and stream limits (connections, streams, in-flight calls,
	// HTTP read deadlines).

	// Logging and observability settings.

	// Logger receives the server's logs. Nil: slog.Default().
	Logger *slog.Logger
	// RaftLogLevel is the hclog level of Raft's own logs ("trace", "debug",
	// "info", "warn", "error", "off"). Default "warn".
	RaftLogLevel string
	// RaftLogOutput receives Raft's logs. Nil: os.Stderr.
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
		MaxRequestBytes:    1 << 20,
		MaxRenewBatch:      10000,
		MaxListLimit:       10000,
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
		RaftLogLevel:       "warn",
	}
}

// Validate reports every problem of c joined in one error, or nil.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("dlockd: config: "+format, a...)) }
	if c.NodeID == "" {
		bad("NodeID is empty")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("Listen %q: %v", c.Listen, err)
	}
	if c.DataDir == "" {
		bad("DataDir is empty")
	}
	if _, _, err := net.SplitHostPort(c.RaftBind); err != nil {
		bad("RaftBind %q: %v", c.RaftBind, err)
	}
	if c.RaftAdvertise != "" {
		if _, _, err := net.SplitHostPort(c.RaftAdvertise); err != nil {
			bad("RaftAdvertise %q: %v", c.RaftAdvertise, err)
		}
	}
	if len(c.Peers) > 0 {
		bad("Peers: clusters of more than one node are not supported yet (got %d peers)", len(c.Peers))
	}
	if c.MaxKeyBytes < 1 || c.MaxKeyBytes > 512 {
		bad("MaxKeyBytes %d outside [1, 512]", c.MaxKeyBytes)
	}
	if c.MinTTL <= 0 || c.MaxTTL < c.MinTTL {
		bad("TTL range [%v, %v] is empty or not positive", c.MinTTL, c.MaxTTL)
	}
	if c.DefaultTTL < c.MinTTL || c.DefaultTTL > c.MaxTTL {
		bad("DefaultTTL %v outside [%v, %v]", c.DefaultTTL, c.MinTTL, c.MaxTTL)
	}
	if c.MaxWaitersPerKey < 0 {
		bad("MaxWaitersPerKey %d is negative", c.MaxWaitersPerKey)
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
	case "trace", "debug", "info", "warn", "error", "off":
	default:
		bad("RaftLogLevel %q is not one of trace, debug, info, warn, error, off", c.RaftLogLevel)
	}
	return errors.Join(errs...)
}

// RegisterFlags defines one GNU-style flag (--name) for every setting an
// operator may change, writing into c; c's current values are the defaults
// shown in --help. cmd/dlockd calls it; an embedding program may too.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "host:port serving gRPC and JSON over HTTP")
	fs.StringVar(&c.DataDir, "data", c.DataDir, "directory of the Raft log and snapshots")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "Raft node ID")
	fs.StringVar(&c.RaftBind, "raft-bind", c.RaftBind, "host:port of the Raft transport")
	fs.StringVar(&c.RaftAdvertise, "raft-advertise", c.RaftAdvertise, "Raft address other nodes use (default: --raft-bind)")
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
	fs.StringVar(&c.RaftLogLevel, "raft-log-level", c.RaftLogLevel, "Raft log level: trace, debug, info, warn, error, off")
	fs.BoolVar(&c.NoSync, "unsafe-no-fsync", c.NoSync, "do not fsync the Raft log (tests and benchmarks only: a crash can lose acknowledged grants and reissue fences)")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "serve net/http/pprof under /debug/pprof/ on the API port")
	// Lock-table safety settings.

	// Connection and stream limits.

	// Logging and observability settings.
}
