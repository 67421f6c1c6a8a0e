// Command settlement runs the nightly settlement brief for real: M merchants,
// W workers (each with its own lock store and ledger connection, as separate
// pods would have), one lock per merchant per day (settle:{merchant}:{date}),
// a short lease with heartbeat, every settlement write fenced, and a unique
// constraint on (merchant, date) as the second line of defence.
//
// A chosen worker can be paused inside its critical section for longer than
// the TTL (the GC-pause case): its lease is lost, another worker settles the
// merchant with a greater fence, and the paused worker's late write is
// rejected as stale.
//
//	go run ./examples/settlement                                   # in-process store, SQLite ledger
//	go run ./examples/settlement --store redis://127.0.0.1:6379 --ledger postgres://…
//	go run ./examples/settlement --pause-worker 3 --json
//
// It exits 1 when any merchant is unsettled or settled twice.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	_ "github.com/dlock-dev/dlock/drivers/azblobdriver"
	_ "github.com/dlock-dev/dlock/drivers/consuldriver"
	_ "github.com/dlock-dev/dlock/drivers/dlockddriver"
	_ "github.com/dlock-dev/dlock/drivers/dynamodbdriver"
	_ "github.com/dlock-dev/dlock/drivers/etcddriver"
	_ "github.com/dlock-dev/dlock/drivers/gcsdriver"
	_ "github.com/dlock-dev/dlock/drivers/memdriver"
	_ "github.com/dlock-dev/dlock/drivers/pgadvisory"
	_ "github.com/dlock-dev/dlock/drivers/pgdriver"
	_ "github.com/dlock-dev/dlock/drivers/redisdriver"
	_ "github.com/dlock-dev/dlock/drivers/redlockdriver"
	_ "github.com/dlock-dev/dlock/drivers/zkdriver"
)

func main() {
	cfg := Config{Log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.Store, "store", "mem://settlement", "lock store URL (mem://, redis://, postgres://, dlockd://, …)")
	flag.StringVar(&cfg.Ledger, "ledger", "", "ledger database: postgres://… or sqlite:PATH (default: a new SQLite file in a temp dir)")
	flag.IntVar(&cfg.Merchants, "merchants", 1000, "merchants to settle")
	flag.IntVar(&cfg.Workers, "workers", 8, "workers, each with its own store and ledger connection")
	flag.DurationVar(&cfg.TTL, "ttl", 2*time.Second, "lease TTL")
	flag.StringVar(&cfg.Date, "date", time.Now().UTC().Format("2006-01-02"), "settlement date")
	flag.IntVar(&cfg.PauseWorker, "pause-worker", 0, "worker paused inside its first critical section (-1: none)")
	flag.DurationVar(&cfg.Pause, "pause", 0, "how long the paused worker sleeps at least; it then stays paused until another worker has settled its merchant (default: twice the TTL)")
	flag.DurationVar(&cfg.Work, "work", 0, "time each worker spends inside a critical section before its write (to make a run last)")
	asJSON := flag.Bool("json", false, "print the report as one JSON object")
	flag.Parse()
	if flag.NArg() > 0 {
		fail(fmt.Errorf("unexpected arguments %q (flags only; see -h)", flag.Args()))
	}
	if cfg.Pause == 0 {
		cfg.Pause = 2 * cfg.TTL
	}
	if cfg.Ledger == "" {
		dir, err := os.MkdirTemp("", "settlement-")
		if err != nil {
			fail(err)
		}
		defer os.RemoveAll(dir)
		cfg.Ledger = "sqlite:" + filepath.Join(dir, "ledger.db")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg)
	if err != nil {
		fail(err)
	}
	if *asJSON {
		_ = json.NewEncoder(os.Stdout).Encode(rep)
	} else {
		printReport(rep)
	}
	if rep.Settled != rep.Merchants || rep.Duplicates != 0 {
		os.Exit(1)
	}
}

func fail(err error) {
	msg := err.Error()
	if !strings.HasPrefix(msg, "settlement: ") {
		msg = "settlement: " + msg
	}
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(1)
}

func printReport(r Report) {
	fmt.Printf(`settlement report
  store %s, ledger %s
  %d workers, %d merchants, %.2f s
  settled          %d / %d
  duplicates       %d
  stale rejected   %d   (late writes refused by the fence)
  unique blocked   %d   (second writes refused by the (merchant, date) constraint)
  store unavailable %d  (attempts the store could not answer; retried in a later pass)
lock
  acquisitions     %d, contended attempts %d
  acquire latency  p50 %.2f ms, p99 %.2f ms
  hold time        p50 %.2f ms, p99 %.2f ms
  renewals         %d, failures %d, smallest margin %.3f s
  lost while working %d
`, r.Store, r.Ledger, r.Workers, r.Merchants, r.Seconds, r.Settled, r.Merchants, r.Duplicates, r.StaleRejected, r.UniqueBlocked, r.Unavailable,
		r.Lock.Acquisitions, r.Lock.Contended, r.Lock.AcquireP50Ms, r.Lock.AcquireP99Ms, r.Lock.HoldP50Ms, r.Lock.HoldP99Ms,
		r.Lock.Renewals, r.Lock.RenewalFailures, r.Lock.MinRenewalMarginS, r.Lock.LostWhileWorking)
}
