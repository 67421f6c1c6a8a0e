// Command dlockd is the dlock lock server: a Raft-replicated lock table
// served over gRPC and JSON over HTTP on one port.
//
// With no flags it starts a single voter on 127.0.0.1:7450 with its data in
// ./dlockd-data; clients reach it as dlockd://127.0.0.1:7450. SIGINT or
// SIGTERM shut it down gracefully. See package server for the guarantees.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/dlock-dev/dlock/server"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("dlockd", flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "host:port serving gRPC and JSON over HTTP")
	fs.StringVar(&cfg.DataDir, "data", cfg.DataDir, "directory of the Raft log and snapshots")
	fs.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "Raft node ID")
	fs.StringVar(&cfg.RaftBind, "raft-bind", cfg.RaftBind, "host:port of the Raft transport")
	fs.StringVar(&cfg.RaftAdvertise, "raft-advertise", cfg.RaftAdvertise, "Raft address other nodes use (default: -raft-bind)")
	fs.IntVar(&cfg.MaxWaitersPerKey, "max-waiters-per-key", cfg.MaxWaitersPerKey, "queue length limit per key")
	fs.IntVar(&cfg.MaxLeases, "max-leases", cfg.MaxLeases, "held keys limit of the server")
	fs.IntVar(&cfg.MaxRequestBytes, "max-request-bytes", cfg.MaxRequestBytes, "request size limit, bytes")
	fs.DurationVar(&cfg.MinTTL, "min-ttl", cfg.MinTTL, "shortest lease TTL")
	fs.DurationVar(&cfg.MaxTTL, "max-ttl", cfg.MaxTTL, "longest lease TTL")
	fs.DurationVar(&cfg.DefaultTTL, "default-ttl", cfg.DefaultTTL, "TTL of requests that give none")
	fs.DurationVar(&cfg.HeartbeatTimeout, "raft-heartbeat-timeout", cfg.HeartbeatTimeout, "Raft heartbeat timeout")
	fs.DurationVar(&cfg.ElectionTimeout, "raft-election-timeout", cfg.ElectionTimeout, "Raft election timeout")
	fs.DurationVar(&cfg.LeaderLeaseTimeout, "raft-leader-lease-timeout", cfg.LeaderLeaseTimeout, "Raft leader lease timeout (< heartbeat timeout)")
	fs.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "how often Raft checks whether to snapshot")
	fs.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", cfg.SnapshotThreshold, "log entries since the last snapshot that trigger one")
	fs.StringVar(&cfg.RaftLogLevel, "raft-log-level", cfg.RaftLogLevel, "Raft log level: trace, debug, info, warn, error, off")
	fs.BoolVar(&cfg.NoSync, "unsafe-no-fsync", false, "do not fsync the Raft log (tests and benchmarks only: a crash can lose acknowledged grants and reissue fences)")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ on the API port")
	gcPercent := fs.Int("gc-percent", 100, "Go GC target percentage when GOGC is not set (lower: less memory, more CPU)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gcPercent)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "dlockd: -log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	cfg.Logger = log
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	srv, err := server.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := srv.Start(); err != nil {
		log.Error("dlockd: start failed", "err", err)
		return 1
	}
	<-ctx.Done()
	stop()
	log.Info("dlockd: shutting down")
	if err := srv.Close(); err != nil {
		log.Error("dlockd: shutdown", "err", err)
		return 1
	}
	log.Info("dlockd: stopped")
	return 0
}
