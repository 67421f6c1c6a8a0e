// Command dlockd is the dlock lock server: a Raft-replicated lock table
// served over gRPC and JSON over HTTP on one port.
//
// With no flags it starts a single voter on 127.0.0.1:7450 with its data in
// ./dlockd-data; clients reach it as dlockd://127.0.0.1:7450. SIGINT or
// SIGTERM shut it down gracefully. SIGHUP reloads --auth-file and every
// TLS file: --tls-cert, --tls-key, --tls-client-ca, --tls-ca, --peer-cert,
// --peer-key and --peer-ca, for the next handshakes on the API and Raft
// ports and of this node's own dials (a file that does not parse keeps
// what is in force and logs an error). See package server for the
// guarantees.
//
// A cluster of 3 or 5 voters starts with the same --initial-cluster on every
// member's first start (restarts ignore it and use the data directory):
//
//	dlockd --node-id n1 --listen 127.0.0.1:7450 --raft-bind 127.0.0.1:7451 \
//	  --initial-cluster n1=127.0.0.1:7451,n2=127.0.0.1:7461,n3=127.0.0.1:7471
//
// and a node joins a running cluster with --join HOST:PORT (any member's
// API address). --advertise is the API address others use (default
// --listen). Off loopback the Raft port speaks mutual TLS: --peer-cert,
// --peer-key and --peer-ca are then required. The API port serves gRPC
// and HTTPS over TLS with --tls-cert and --tls-key (clients then use
// dlockd://HOST:PORT?tls=1&ca=FILE), and requires client certificates with
// --tls-client-ca (on every call but /healthz, /readyz, /metrics and the
// dashboard's static files); members verify each other's API certificates
// against --tls-ca (default --peer-ca) and present their peer certificate.
// Client and identity certificates must never be issued by the --peer-ca
// CA: one of its certificates whose CN is a node ID is a cluster member,
// and one may join the cluster under its CN (dlockd warns when
// --tls-client-ca names a --peer-ca certificate). A
// --listen that is not loopback needs --tls-cert, or --insecure-listen.
//
// --config FILE reads the flags from a YAML file whose keys are the long
// flag names (listen: 127.0.0.1:7450, tls-cert: /etc/dlockd/tls/n1.pem; a
// list is joined with commas); a flag given on the command line wins over
// the file, and an unknown key or a bad value exits 2 naming the file, the
// key and the problem. deploy/systemd/dlockd.service runs
// dlockd --config /etc/dlockd/dlockd.yaml; deploy/examples/cluster-tls has
// a 3-node cluster's files.
//
// Memory: once allocation has been quiet for --release-memory-after
// (default 5s; 0: off), dlockd returns to the OS the heap a burst of
// requests left free (memory.go); --gc-percent (or GOGC) and GOMEMLIMIT
// are Go's own settings. Unless GOGC is set, the heap may grow at least
// --gc-headroom-bytes (default 16 MiB; 0: off) past the live heap between
// two collections, so that a server holding few leases does not collect
// many times a second under load.
//
// Logs go to stderr in one format (--log-format text or json) at one level
// (--log-level), Raft's included. dlockd --version prints the build (the
// line of dlock version, naming dlockd); dlockd --help prints the flags. Exit status:
// 0 after a clean shutdown (or --help, --version), 1 when the server fails
// to start (its data directory locked by another dlockd, a port in use)
// or to stop, 2 for bad flags or configuration: a bad flag, --config file
// or value, and a start refused for a file the configuration names (an
// auth file, certificate, key or CA that is missing or does not parse, an
// audit log that cannot be written: server.ErrConfig).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/dlock-dev/dlock/internal/buildinfo"
	"github.com/dlock-dev/dlock/server"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is dlockd with args (without the program name); it returns the exit
// status.
func run(args []string, stdout, stderr io.Writer) int {
	cfg := server.DefaultConfig()
	fs := pflag.NewFlagSet("dlockd", pflag.ContinueOnError)
	fs.SortFlags = false
	configPath := fs.String(configFlag, "", "read flags from this YAML file (keys are the long flag names: listen: 127.0.0.1:7450); flags on the command line win")
	cfg.RegisterFlags(fs)
	gcPercent := fs.Int("gc-percent", 100, "Go GC target percentage when GOGC is not set (lower: less memory, more CPU; -1: no collection at all, and no headroom)")
	gcHeadroomBytes := fs.Int64("gc-headroom-bytes", 16<<20, "the least heap growth, bytes, between two Go GC runs when GOGC is not set and --gc-percent is not -1: the heap goal is at least the live heap + this, so a server holding few leases does not collect many times a second under load (at the cost of up to this much garbage while busy); 0: gc-percent alone")
	releaseAfter := fs.Duration("release-memory-after", 5*time.Second, "return to the OS the heap memory a burst of allocation left free once allocation has been quiet this long (one forced GC); 0: leave it to Go's scavenger")
	logLevel := fs.String("log-level", "info", "log level of dlockd and Raft: debug, info, warn, error")
	logFormat := fs.String("log-format", "text", "log format: text or json (one object a line)")
	version := fs.Bool("version", false, "print the version and exit")
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: dlockd [flags]\n\ndlockd is the dlock lock server. Flags:\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) { // the usage is printed
			return 0
		}
		fmt.Fprintf(stderr, "dlockd: %v (see dlockd --help)\n", err)
		return 2
	}
	if *version {
		fmt.Fprintln(stdout, buildinfo.Read().Line("dlockd"))
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dlockd: unexpected argument %q (see dlockd --help)\n", fs.Arg(0))
		return 2
	}
	if *configPath != "" {
		if err := applyConfigFile(fs, *configPath); err != nil {
			fmt.Fprintf(stderr, "dlockd: %v\n", err)
			return 2
		}
	}
	if *releaseAfter < 0 {
		fmt.Fprintln(stderr, badValue(fs, "release-memory-after", "want 0 (off) or a positive duration"))
		return 2
	}
	if *gcPercent < -1 {
		fmt.Fprintln(stderr, badValue(fs, "gc-percent", "want -1 (GC off) or a percentage of 0 or more"))
		return 2
	}
	if *gcHeadroomBytes < 0 {
		fmt.Fprintln(stderr, badValue(fs, "gc-headroom-bytes", "want 0 (off) or a positive number of bytes"))
		return 2
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gcPercent)
		defer startGCHeadroom(*gcPercent, uint64(*gcHeadroomBytes))()
	}
	if !cfg.Pprof {
		// Nobody can read a heap profile without --pprof: sample no
		// allocations (the samples' buckets are memory that grows with
		// the server's work, about 1.5 MB with 100,000 leases held).
		runtime.MemProfileRate = 0
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(stderr, badValue(fs, "log-level", "want debug, info, warn or error"))
		return 2
	}
	hopts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch *logFormat {
	case "text":
		h = slog.NewTextHandler(stderr, hopts)
	case "json":
		h = slog.NewJSONHandler(stderr, hopts)
	default:
		fmt.Fprintln(stderr, badValue(fs, "log-format", "want text or json"))
		return 2
	}
	log := slog.New(h)
	cfg.Logger = log
	if err := cfg.Validate(); err != nil { // every problem, on one line
		fmt.Fprintln(stderr, strings.ReplaceAll(err.Error(), "\n", "; "))
		return 2
	}
	srv, err := server.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, strings.ReplaceAll(err.Error(), "\n", "; "))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := srv.Start(); err != nil {
		log.Error("dlockd: start failed", "err", err)
		if errors.Is(err, server.ErrConfig) {
			// A bad auth file, certificate, key, CA or audit log path:
			// starting again fails the same way (the systemd unit does
			// not restart on 2).
			return 2
		}
		return 1
	}
	defer startMemoryRelease(*releaseAfter, log)()
	// SIGHUP: reload the auth file and the TLS files (server.Reload logs
	// and audits the outcome).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	hupDone := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				if err := srv.ReloadAs("signal:SIGHUP"); err != nil { // the audit lines' identity
					log.Error("dlockd: reload on SIGHUP failed; the previous settings stay in force", "err", err)
				} else {
					log.Info("dlockd: reloaded on SIGHUP")
				}
			case <-hupDone:
				return
			}
		}
	}()
	defer func() { signal.Stop(hup); close(hupDone) }()
	code := 0
	select {
	case <-ctx.Done():
	case err := <-srv.Failed():
		// This node cannot take part in the cluster (a member that lost its
		// data directory, started again with --initial-cluster): say so and
		// exit instead of running as a member that can never serve.
		log.Error("dlockd: cannot take part in the cluster", "err", err)
		code = 1
	}
	stop()
	log.Info("dlockd: shutting down")
	if err := srv.Close(); err != nil {
		log.Error("dlockd: shutdown", "err", err)
		return 1
	}
	log.Info("dlockd: stopped")
	return code
}
