// Command dlockd is the dlock lock server: a Raft-replicated lock table
// served over gRPC and JSON over HTTP on one port.
//
// With no flags it starts a single voter on 127.0.0.1:7450 with its data in
// ./dlockd-data; clients reach it as dlockd://127.0.0.1:7450. SIGINT or
// SIGTERM shut it down gracefully. See package server for the guarantees.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/dlock-dev/dlock/server"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg := server.DefaultConfig()
	fs := pflag.NewFlagSet("dlockd", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
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
