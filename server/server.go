package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/bbolt"
	"google.golang.org/grpc"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// walDir is the directory of the Raft log under Config.DataDir.
const walDir = "wal"

// ErrServerClosed is returned by Start on a server that was shut down.
var ErrServerClosed = errors.New("dlockd: server closed")

// Server is one dlockd node: the Raft-replicated lock table and its gRPC and
// JSON-over-HTTP API on one port. Create it with New, then Start it; stop it
// with Shutdown or Close.
type Server struct {
	cfg Config
	log *slog.Logger

	fsm         *fsm
	clock       *leaseClock
	offset      *clockOffset // Config.TestClockOffsetFile; nil without
	waits       waitRegistry
	waitTimes   waitTimes // when each queue entry was applied here (waittimes.go; the dashboard, the wait histogram)
	sessions    sessionHub
	metrics     *metrics
	lockMetrics *lockMetrics
	lim         *limits   // capped resources of this node and their refusals
	auth        authState // auth file rules and audit log (auth.go, audit.go)
	calls       *callPool // runs Session calls

	readIndex leaderCheck // one VerifyLeader round shared by concurrent renewals and reads (readindex.go)
	proposer  proposer    // gathers concurrent proposals into log entries (propose.go)

	raft      *raft.Raft
	transport *raft.NetworkTransport
	stream    *streamLayer          // the transport's TCP or mutual-TLS connections
	store     *raftboltdb.BoltStore // stable store, and the log of old data directories
	wal       *raftwal.WAL          // the log (hashicorp/raft-wal)
	walMeta   *metadb.BoltMetaDB    // raft-wal's meta store, closed by the server

	ln      net.Listener
	mux     *connMux
	tls     *apiTLS // API TLS (tls.go); nil: plaintext
	grpcSrv *grpc.Server
	httpSrv *http.Server

	// tlsFailures is dlockd_tls_handshake_failures_total (tls.go).
	tlsFailures *prometheus.CounterVec

	// Membership (cluster.go).
	peers       peers                      // gRPC clients of other members' APIs
	memberMu    sync.Mutex                 // one membership change at a time (leader)
	boundAPI    atomic.Value               // string: the API's bound address, set once listening (read without Server.mu)
	memberWake  chan struct{}              // pokes memberLoop
	incarnation string                     // this data directory's random ID (stable store)
	raftUp      atomic.Bool                // s.raft is set (read by probe answers, which start before it)
	hasState    atomic.Bool                // Raft state exists (restart, bootstrapped or joined): told to probing members
	failed      chan error                 // receives the error that keeps this node out of the cluster (see Failed)
	removed     atomic.Bool                // removed from the cluster (leaveCluster): calls are answered NOT_MEMBER
	diverged    atomic.Uint64              // index of the first committed entry the FSM could not decode (0: none); see undecodable
	batchProbe  atomic.Pointer[batchProbe] // the leader's latest probe of which members decode batch entries (batchgate.go)
	probing     atomic.Bool                // a probe round is running (startBatchProbe)
	batchLogged string                     // the batch verdict last logged (probeBatchMembers only, one round at a time)

	ready atomic.Bool // leader, caught up, countdowns restarted: serving writes
	// transferring counts leadership transfers this node started that may
	// still elect another node (see transferLeadership): while it is not
	// zero, renewals and reads are not answered from this node's memory.
	transferring atomic.Int32
	closing      chan struct{} // closed when Shutdown starts: waits give up
	stopCh       chan struct{} // closed to stop the background loops
	loops        sync.WaitGroup
	serving      sync.WaitGroup

	mu       sync.Mutex // guards started, stopped
	started  bool
	stopped  bool
	stopErr  error
	stopDone chan struct{}
}

// New validates cfg and returns a server that is not yet started.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Batching = cfg.Batching.normal()
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	now := time.Now
	var offset *clockOffset
	if cfg.TestClockOffsetFile != "" {
		offset = &clockOffset{path: cfg.TestClockOffsetFile}
		if _, _, err := offset.read(); err != nil {
			return nil, fmt.Errorf("dlockd: TestClockOffsetFile: %w", err)
		}
		now = offset.now
	}
	s := &Server{
		cfg:      cfg,
		log:      log,
		clock:    newLeaseClock(now, cfg.ClaimWindow),
		offset:   offset,
		closing:  make(chan struct{}),
		stopCh:   make(chan struct{}),
		stopDone: make(chan struct{}),

		memberWake: make(chan struct{}, 1),
		failed:     make(chan error, 1),
	}
	s.peers.rewrite = cfg.RaftDialRewrite
	s.waits.m = make(map[keyOwner]*waitEntry)
	s.sessions.subs = make(map[string]map[*subscriber]struct{})
	s.fsm = newFSM(s)
	s.metrics = newMetrics(s)
	s.lockMetrics = newLockMetrics(s.metrics.reg)
	s.initAudit() // audit metrics (audit.go)
	s.initTLSMetrics()
	s.clock.ended = func(d time.Duration) { s.lockMetrics.held(s.ready.Load(), d) }
	s.lim = &limits{}
	s.lim.bind(s)
	return s, nil
}

// Start opens the data directory, starts Raft, listens on Config.Listen and
// serves. On a first start (an empty data directory) it bootstraps this
// node alone when Config.InitialCluster names no other member; with other
// members, a background loop probes them and bootstraps the voters of
// InitialCluster only when they allow it (see bootstrapLoop; a refusal is
// sent on Failed); with Config.Join, a background loop asks the member at
// Join to add this node. A restart uses the data directory's configuration. It
// returns once the port is listening; use WaitReady to wait for
// leadership.
func (s *Server) Start() (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return ErrServerClosed
	}
	if s.started {
		return errors.New("dlockd: server already started")
	}
	s.started = true
	defer func() {
		if err != nil {
			s.teardown()
		}
	}()
	// The auth file and the audit log (auth.go, audit.go): a bad file
	// refuses to start.
	if err := s.loadAuth(); err != nil {
		return configErr(err) // ErrConfig: cmd/dlockd exits 2
	}
	if err := s.startAudit(); err != nil {
		return configErr(err)
	}
	if s.tls, err = newAPITLS(s.cfg, s.log); err != nil { // API TLS (issue 12): read the files first (ErrConfig)
		return err
	}
	s.peers.creds = s.memberGRPCCreds()
	if err := os.MkdirAll(s.cfg.DataDir, 0o750); err != nil {
		return fmt.Errorf("dlockd: data dir: %w", err)
	}
	rlog := s.raftLogger()

	s.store, err = raftboltdb.New(raftboltdb.Options{
		Path:        filepath.Join(s.cfg.DataDir, "raft.db"),
		NoSync:      s.cfg.NoSync,
		BoltOptions: &bbolt.Options{Timeout: 2 * time.Second, NoSync: s.cfg.NoSync, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType},
	})
	if err != nil {
		return fmt.Errorf("dlockd: open raft log in %s (is another dlockd using it?): %w", s.cfg.DataDir, err)
	}
	s.removeSnapshotTemps() // under raft.db's file lock: no other dlockd is writing one
	// The log is hashicorp/raft-wal in DataDir/wal: segment files written
	// with one write and one fsync per batch, no B-tree and no msgpack. The
	// bbolt file keeps the stable store (term, vote). A data directory
	// written by a version that kept the log in bbolt goes on using it, and
	// so does -unsafe-no-fsync (raft-wal always syncs).
	var logStore raft.LogStore = s.store
	walPath := filepath.Join(s.cfg.DataDir, walDir)
	if _, statErr := os.Stat(walPath); statErr == nil || (!s.cfg.NoSync && !s.boltHasLogs()) {
		if err := os.MkdirAll(walPath, 0o750); err != nil {
			return fmt.Errorf("dlockd: raft log dir: %w", err)
		}
		// raft-wal v0.4.0's Close leaves its meta store open (and its file
		// lock held), so the server owns the meta store and closes it.
		s.walMeta = &metadb.BoltMetaDB{}
		if s.wal, err = raftwal.Open(walPath, raftwal.WithLogger(rlog), raftwal.WithMetaStore(s.walMeta)); err != nil {
			return fmt.Errorf("dlockd: open raft log %s: %w", walPath, err)
		}
		logStore = s.wal
	}
	logs := newLogCache(logStore, logCacheEntries, logCacheBytes)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(s.cfg.DataDir, 2, rlog)
	if err != nil {
		return fmt.Errorf("dlockd: snapshot store: %w", err)
	}
	existing, err := raft.HasExistingState(logs, s.store, snaps)
	if err != nil {
		return fmt.Errorf("dlockd: read raft state: %w", err)
	}
	if err := s.loadIncarnation(); err != nil {
		return err
	}
	raftAdv := s.cfg.RaftAdvertise
	for _, p := range s.cfg.InitialCluster {
		if p.ID == s.cfg.NodeID && raftAdv == "" {
			raftAdv = p.RaftAddr
		}
	}
	// A node joining on an empty data directory keeps its Raft port shut
	// until the leader agrees (see joinLoop); one started with
	// InitialCluster on an empty data directory keeps it shut until the
	// other members' answers to its probe allow it (see bootstrapLoop).
	joining := s.cfg.Join != "" && !existing
	probing := !existing && !joining && s.otherInitialMembers() > 0
	s.hasState.Store(existing)
	if s.stream, err = newStreamLayer(s.cfg, raftAdv, !joining && !probing, s.answerProbe); err != nil {
		return fmt.Errorf("dlockd: raft transport on %s: %w", s.cfg.RaftBind, err)
	}
	// MaxRPCsInFlight 1 turns off raft's pipelined replication. Its
	// netPipeline can deadlock when a follower answers a pipelined append
	// with failure: pipelineDecode returns, decodeResponses then blocks on
	// doneCh, the next pipelined send blocks on inprogressCh, and the
	// replication goroutine never ends, so that follower gets no more
	// entries (only heartbeats) and Raft's Shutdown waits forever (seen
	// here: a leader's Close hung; hashicorp/raft issue 612). Synchronous
	// appends, batched by MaxAppendEntries, cost little (raft's own
	// analysis in its pull request 541).
	s.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: s.stream, MaxPool: 3, Timeout: 10 * time.Second, Logger: rlog, MaxRPCsInFlight: 1,
	})

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(s.cfg.NodeID)
	rc.HeartbeatTimeout = s.cfg.HeartbeatTimeout
	rc.ElectionTimeout = s.cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = s.cfg.LeaderLeaseTimeout
	rc.CommitTimeout = s.cfg.CommitTimeout
	rc.MaxAppendEntries = s.cfg.MaxAppendEntries
	rc.BatchApplyCh = true
	rc.SnapshotInterval = s.cfg.SnapshotInterval
	rc.SnapshotThreshold = s.cfg.SnapshotThreshold
	rc.TrailingLogs = s.cfg.TrailingLogs
	rc.Logger = rlog
	if err := raft.ValidateConfig(rc); err != nil {
		return fmt.Errorf("dlockd: raft config: %w", err)
	}

	conf := raft.Configuration{Servers: []raft.Server{{
		Suffrage: raft.Voter, ID: rc.LocalID, Address: s.transport.LocalAddr(),
	}}}
	if len(s.cfg.InitialCluster) > 0 {
		conf.Servers = conf.Servers[:0]
		for _, p := range s.cfg.InitialCluster {
			conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr)})
		}
	}
	if !existing && !joining && !probing {
		if err := raft.BootstrapCluster(rc, logs, s.store, snaps, s.transport, conf); err != nil {
			return fmt.Errorf("dlockd: bootstrap: %w", err)
		}
		s.hasState.Store(true)
	}
	if last, err := logs.LastIndex(); err == nil {
		// Entries up to last were applied before this start: the times at
		// which they are applied again say nothing of their age (ui.go).
		s.clock.replayTo, s.waitTimes.replayTo = last, last
	}
	s.raft, err = raft.NewRaft(rc, s.fsm, logs, s.store, snaps, voteTransport{s.transport})
	if err != nil {
		return fmt.Errorf("dlockd: start raft: %w", err)
	}
	s.raftUp.Store(true) // s.raft is set: probes may read it
	// Failing heartbeats, for the member metrics (membermetrics.go).
	s.raft.RegisterObserver(s.metrics.raftObserver())
	if existing {
		if err := s.checkMember(); err != nil {
			return err
		}
	}

	s.ln, err = net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("dlockd: listen: %w", err)
	}
	s.boundAPI.Store(s.ln.Addr().String())
	s.mux = newConnMux(s.ln, s.lim, s.log, s.cfg.MaxConnections)
	s.mux.maxPerIP = int64(s.cfg.MaxConnectionsPerIP)
	if s.tls != nil {
		s.mux.tls, s.mux.handshakeFailed = s.tls.base, s.tlsHandshakeFailed
	}
	s.calls = newCallPool(8*runtime.GOMAXPROCS(0), s.stopCh)
	s.grpcSrv = newGRPCServer(s)
	dlockv1.RegisterClusterServer(s.grpcSrv, &clusterAPI{s: s})
	s.httpSrv = &http.Server{
		Handler:           s.refuseIfRemoved(newHTTPHandler(s)),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    maxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		ConnContext:       s.httpConnContext, // the TLS state, for the handlers (tls.go)
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.serving.Add(3)
	go func() { defer s.serving.Done(); s.mux.serve() }()
	go func() { defer s.serving.Done(); _ = s.grpcSrv.Serve(s.mux.grpc) }()
	go func() { defer s.serving.Done(); _ = s.httpSrv.Serve(s.mux.http) }()

	s.loops.Add(3)
	go s.leadershipLoop()
	go s.expireLoop()
	go s.memberLoop()
	if s.offset != nil {
		s.loops.Add(1)
		go s.clockOffsetLoop(s.offset)
	}
	if joining {
		s.loops.Add(1)
		go s.joinLoop()
	}
	if probing {
		s.loops.Add(1)
		go s.bootstrapLoop(conf)
	}

	s.log.Info("dlockd listening", "listen", s.ln.Addr().String(), "data", s.cfg.DataDir,
		"raft", string(s.transport.LocalAddr()), "node", s.cfg.NodeID, "url", "dlockd://"+s.ln.Addr().String(),
		"batching", string(s.batchMode()))
	return nil
}

// checkMember refuses a data directory whose Raft configuration does not
// name this node: started with another --node-id, the node would wait for
// an election it can never win and stay unready without saying why.
func (s *Server) checkMember() error {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("dlockd: read raft configuration: %w", err)
	}
	servers := f.Configuration().Servers
	var ids []string
	for _, m := range servers {
		if m.ID == raft.ServerID(s.cfg.NodeID) {
			return nil
		}
		ids = append(ids, string(m.ID))
	}
	if len(servers) == 0 {
		return nil
	}
	// The members registry (as far as the restored snapshot has it) names
	// the node whose data directory this is by its incarnation.
	s.fsm.mu.RLock()
	ms := s.fsm.copyMembers()
	s.fsm.mu.RUnlock()
	for id, m := range ms {
		if m.incarnation != "" && m.incarnation == s.incarnation && id != s.cfg.NodeID && slices.Contains(ids, id) {
			return fmt.Errorf("dlockd: data dir %s is member %q's (its Raft configuration, members %v, records this data dir under that ID), not --node-id %q's: start it with --node-id %s, or give this node an empty data dir", s.cfg.DataDir, id, ids, s.cfg.NodeID, id)
		}
	}
	return fmt.Errorf("dlockd: data dir %s has a Raft configuration (members %v) that does not name --node-id %q: this node was removed from the cluster, or the data dir belongs to another node; do not start another member's ID on it (a removed node's old log must not run as a live member): to add this node, empty the data dir and start it with --join", s.cfg.DataDir, ids, s.cfg.NodeID)
}

// refuseIfRemoved answers the API's JSON routes with NOT_MEMBER once this
// node was removed from the cluster (see leaveCluster), except the health
// and metrics routes and this node's own status (?local=true).
func (s *Server) refuseIfRemoved(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local := r.URL.Path == "/v1/cluster/status" && r.Method == http.MethodGet && (r.URL.Query().Get("local") == "true" || r.URL.Query().Get("local") == "1")
		if s.removed.Load() && strings.HasPrefix(r.URL.Path, "/v1/") && !local {
			_ = writeReply(w, nil, s.removedErr())
			return
		}
		h.ServeHTTP(w, r)
	})
}

// boltHasLogs reports whether the bbolt file holds log entries (a data
// directory of a version without raft.wal).
func (s *Server) boltHasLogs() bool {
	last, err := s.store.LastIndex()
	return err != nil || last > 0
}

// raftLogger returns the logger of Raft, raft-wal and the Raft transport.
// Their lines go to Config.Logger's handler, so that one format and one
// level apply to everything; Config.RaftLogLevel, when set, overrides the
// level for Raft's lines alone. Config.RaftLogOutput, when set, receives
// Raft's lines as slog text instead.
func (s *Server) raftLogger() hclog.Logger {
	if s.cfg.RaftLogLevel == "off" {
		return hclog.NewNullLogger()
	}
	h := s.log.Handler()
	if out := s.cfg.RaftLogOutput; out != nil {
		level := hclogToSlog(newHclogSlog(h, "raft", s.cfg.RaftLogLevel).GetLevel())
		h = slog.NewTextHandler(out, &slog.HandlerOptions{Level: level})
	}
	return newHclogSlog(h, "raft", s.cfg.RaftLogLevel)
}

// Addr returns the address the API listens on (useful with port 0), or ""
// before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// URL returns the store URL of this server, dlockd://host:port.
func (s *Server) URL() string { return "dlockd://" + s.Addr() }

// Ready reports whether the node serves writes: it is the leader, has
// applied its whole log, has restarted its countdowns and has given the
// queue entries of clients not connected to it their grace.
func (s *Server) Ready() bool { return s.ready.Load() }

// WaitReady blocks until Ready or ctx ends, and returns ctx's error then.
func (s *Server) WaitReady(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !s.ready.Load() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("dlockd: not ready: %w", ctx.Err())
		case <-s.stopCh:
			return ErrServerClosed
		case <-t.C:
		}
	}
	return nil
}

// Shutdown stops the server gracefully: it stops accepting, answers waiting
// acquisitions with UNAVAILABLE (SHUTTING_DOWN), lets running requests
// finish until ctx ends (then cuts them), and shuts Raft and the log store
// down. Grants and queue entries stay in the log: the next leader (another
// member, or this node restarted) keeps each queue entry for its grace
// period (its TTL), so a waiter that re-sends its request keeps its place.
// Safe to call twice.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		<-s.stopDone
		return s.stopErr
	}
	s.stopped = true
	s.mu.Unlock()

	close(s.closing)
	var errs []error
	if s.grpcSrv != nil {
		s.mux.close()
		done := make(chan struct{})
		go func() { s.grpcSrv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpcSrv.Stop()
			<-done
		}
		if err := s.httpSrv.Shutdown(ctx); err != nil {
			_ = s.httpSrv.Close()
		}
		s.serving.Wait()
	}
	s.teardown()
	if len(errs) > 0 {
		s.stopErr = errors.Join(errs...)
	}
	close(s.stopDone)
	return s.stopErr
}

// Close is Shutdown bounded by Config.ShutdownTimeout.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	return s.Shutdown(ctx)
}

// teardown stops the loops, Raft, the transport and the store.
func (s *Server) teardown() {
	select {
	case <-s.stopCh:
	default:
		close(s.stopCh)
	}
	s.loops.Wait()
	s.peers.close()
	s.ready.Store(false)
	if s.raft != nil {
		if err := s.raft.Shutdown().Error(); err != nil {
			s.log.Warn("dlockd: raft shutdown", "err", err)
		}
	}
	if s.transport != nil {
		_ = s.transport.Close()
	}
	if s.wal != nil {
		_ = s.wal.Close()
	}
	if s.walMeta != nil {
		_ = s.walMeta.Close()
	}
	if s.store != nil {
		_ = s.store.Close()
	}
	if s.ln != nil && s.mux == nil {
		_ = s.ln.Close()
	}
	s.stopAudit() // the audit lines still buffered are written (audit.go)
}

// leadershipLoop follows Raft's leadership and becomes ready after each
// election won. Taking up leadership is retried, with backoff, for as long
// as this node stays the leader: a failed attempt (a barrier that timed out,
// a purge that could not commit) must not leave a leader unready for good.
func (s *Server) leadershipLoop() {
	defer s.loops.Done()
	ch := s.raft.LeaderCh()
	var retry <-chan time.Time
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-s.stopCh:
			return
		case leader := <-ch:
			if !leader {
				s.ready.Store(false)
				retry = nil
				s.log.Info("dlockd: no longer the leader", "node", s.cfg.NodeID)
				continue
			}
			backoff = 50 * time.Millisecond
		case <-retry:
			retry = nil
			if s.raft.State() != raft.Leader {
				continue
			}
		}
		if err := s.becomeLeader(); err != nil {
			s.log.Warn("dlockd: leadership not taken up, retrying", "err", err, "in", backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// becomeLeaderHook, when set (tests only), runs first in becomeLeader and
// can make it fail.
var becomeLeaderHook func() error

// becomeLeader catches up the FSM, restarts every lease countdown at its
// full TTL (a suspect grant at its logged time left; late, never early),
// gives the queue entries of clients that are not connected to this node
// their grace, and opens for writes.
func (s *Server) becomeLeader() error {
	if err := s.divergedLeader(); err != nil {
		return err
	}
	if h := becomeLeaderHook; h != nil {
		if err := h(); err != nil {
			return err
		}
	}
	if err := s.raft.Barrier(s.cfg.ApplyTimeout).Error(); err != nil {
		return err
	}
	// Raft's own entries of this term (its no-op, the barrier) never reach
	// the FSM; a no-op command does, so that the FSM's applied index is the
	// commit index again and reads need not wait (see readBarrier).
	if _, err := s.propose(&command{op: opNoop}); err != nil {
		return err
	}
	// The barrier and the no-op applied what this node had not applied
	// yet: an entry among them may not have decoded.
	if err := s.divergedLeader(); err != nil {
		return err
	}
	s.clock.restartAll()
	s.startGrace() // queue entries of clients not connected here: purged after their grace (grace.go)
	s.ready.Store(true)
	s.clock.poke()
	s.pokeMembers() // register this leader's API address (memberLoop)
	s.log.Info("dlockd: leader and ready", "node", s.cfg.NodeID)
	return nil
}

// expireLoop proposes, while this node is ready, an entry for every
// countdown that runs out: an expiry (opExpire), the release of an unclaimed
// handover (opUnclaimed), or the end of a lock-delay (opEndDelay). Each
// carries the version its countdown ran for; the FSM ignores a stale one.
// It also logs the grants that turn suspect, and their checkpoints
// (opSuspect), and purges the queue entries whose grace ran out
// (opPurgeIdle).
func (s *Server) expireLoop() {
	defer s.loops.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := time.Hour
		if s.ready.Load() {
			now := s.clock.now()
			fs, next := s.clock.takeExpired(now, 1024)
			term, gs, gnext := s.clock.takeGrace(now, 1024)
			if len(gs) > 0 {
				s.purgeIdle(term, gs)
			}
			if len(fs) > 0 {
				s.proposeFired(fs)
			}
			if len(fs) > 0 || len(gs) > 0 {
				continue
			}
			if next.IsZero() || (!gnext.IsZero() && gnext.Before(next)) {
				next = gnext
			}
			if !next.IsZero() {
				wait = max(next.Sub(s.clock.now()), 0)
			}
		}
		timer.Reset(wait)
		select {
		case <-s.stopCh:
			return
		case <-timer.C:
		case <-s.clock.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
	}
}

// proposeFired proposes the entries for countdowns that ran out, and puts
// back those whose entry failed, to be tried again.
func (s *Server) proposeFired(fs []fired) {
	var expired, unclaimed []expiry
	var suspects []suspectMark
	var failed []fired
	for _, f := range fs {
		switch f.kind {
		case fireSuspect:
			suspects = append(suspects, suspectMark{key: f.x.key, owner: f.x.owner, version: f.x.version, left: f.left})
		case fireExpire:
			expired = append(expired, f.x)
		case fireUnclaimed:
			unclaimed = append(unclaimed, f.x)
		case fireEndDelay:
			c := &command{op: opEndDelay, key: f.x.key, version: f.x.version}
			if f.x.owner != "" { // the lock-delay of a lost Shared grant (shared.go)
				c = &command{op: opEndSharedDelay, key: f.x.key, owner: f.x.owner, version: f.x.version}
			}
			if _, err := s.propose(c); err != nil {
				failed = append(failed, f)
			}
		}
	}
	if len(expired) > 0 {
		if _, err := s.propose(&command{op: opExpire, expiries: expired}); err != nil {
			for _, x := range expired {
				failed = append(failed, fired{kind: fireExpire, x: x})
			}
		}
	}
	if len(suspects) > 0 {
		// A failed entry needs no retry: the grant stays suspect (its
		// renewals go through the log), and its next checkpoint logs it.
		if _, err := s.propose(&command{op: opSuspect, suspects: suspects}); err != nil {
			s.log.Debug("dlockd: suspect entry not committed", "grants", len(suspects), "err", err)
		}
	}
	if len(unclaimed) > 0 {
		if _, err := s.propose(&command{op: opUnclaimed, expiries: unclaimed}); err != nil {
			for _, x := range unclaimed {
				failed = append(failed, fired{kind: fireUnclaimed, x: x})
			}
		}
	}
	if len(failed) > 0 {
		s.clock.retry(failed, 100*time.Millisecond)
	}
}

// lockEvents is the FSM observer: it moves countdowns, wakes waiters and
// pushes loss to sessions.
func (s *Server) lockEvents(evs []event) {
	s.clock.apply(evs)
	s.waitTimes.apply(evs, time.Now(), s.ready.Load(), func(d time.Duration) { s.lockMetrics.waitSeconds.Observe(d.Seconds()) })
	for i := range evs {
		ev := &evs[i]
		switch ev.kind {
		case evGranted:
			s.lockMetrics.grants.Inc()
			s.waits.notify(keyOwner{ev.key, ev.owner}, waitGrant{fence: ev.fence, ttl: ev.ttl})
		case evDequeued:
			s.waits.dequeued(keyOwner{ev.key, ev.owner})
		case evRemoved:
			switch ev.reason {
			case reasonExpired:
				s.metrics.expired.Inc()
			case reasonUnclaimed:
				s.lockMetrics.unclaimed.Inc()
			}
			if ev.reason != reasonReleased && ev.reason != reasonCancelled && ev.session != "" {
				s.sessions.lost(ev)
			}
		case evDelayed:
			s.lockMetrics.lockDelays.Inc()
		}
	}
	s.keysChanged(evs)
	s.logEvents(evs)
}

// keysChanged tells the Watch streams that watch a key changed by evs
// (a grant made or ended, a lock-delay started or ended), once per key.
func (s *Server) keysChanged(evs []event) {
	if !s.sessions.watching() {
		return
	}
	keys := make(map[string]struct{})
	for i := range evs {
		switch evs[i].kind {
		case evGranted, evRemoved, evDelayed, evDelayEnded:
			keys[evs[i].key] = struct{}{}
		}
	}
	if len(keys) > 0 {
		s.sessions.changed(keys, false)
	}
}

// divergedLeader returns ErrUndecodableEntry (wrapped) when this node's FSM
// skipped a committed entry (see undecodable), after asking Raft to hand
// its leadership to another member (a no-op when this node is not the
// leader), so that becomeLeader never makes a diverged node ready.
func (s *Server) divergedLeader() error {
	i := s.diverged.Load()
	if i == 0 {
		return nil
	}
	if s.raftUp.Load() && s.raft.State() == raft.Leader {
		s.raft.LeadershipTransfer() // non-blocking; the result is not needed
	}
	return fmt.Errorf("dlockd: not taking up leadership: log entry %d did not decode here: %w", i, ErrUndecodableEntry)
}

// undecodable is the FSM observer of a committed command entry it could
// not decode and skipped (an entry written by a newer dlockd, say with
// batched entries turned on in a cluster that still has an older member;
// or corruption). This node's table then lacks a command every other
// member applied, so it must not serve from it: it stops being ready,
// never takes up leadership again, answers every call UNAVAILABLE
// (DIVERGED), and reports ErrUndecodableEntry on Failed (dlockd exits on
// it). Fail closed: a member that skipped a grant or a release could
// otherwise grant a key twice after a failover.
func (s *Server) undecodable(index uint64, err error) {
	if !s.diverged.CompareAndSwap(0, index) {
		s.log.Error("dlockd: another committed log entry does not decode", "index", index, "err", err)
		return
	}
	s.ready.Store(false)
	if s.raftUp.Load() && s.raft.State() == raft.Leader {
		// Another member may lead: it decoded what this node could not.
		s.raft.LeadershipTransfer() // non-blocking
	}
	s.fail(fmt.Errorf("%w: log entry %d: %v", ErrUndecodableEntry, index, err))
}

// lockReset is the FSM observer of a restore.
func (s *Server) lockReset(state []event) {
	s.clock.reset(state)
	s.waitTimes.reset(s.fsm.queued(), time.Now())
	s.sessions.changed(nil, true)
}

// newToken returns 128 random bits, hex-encoded.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
