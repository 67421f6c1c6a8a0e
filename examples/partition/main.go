// Command partition settles merchants with no lock at all: the work is
// partitioned so that each merchant has exactly one owner. Worker i of W owns
// the merchants whose FNV-1a hash mod W is i, and settles only those, so W
// workers can run at the same moment and never meet. It is right when the
// worker set is fixed and each worker knows its index (a StatefulSet's
// ordinal, a numbered cron host); its limit is that a dead worker's share
// waits for that worker to come back. See docs/CHOOSING.md.
//
//	go run ./examples/partition                        # 8 workers, 1,000 merchants, SQLite in a temp dir
//	go run ./examples/partition --workers 3 --down 1   # worker 1 never starts: its share is left unsettled
//
// It exits 1 when a merchant is settled twice, or when one owned by a worker
// that ran is left unsettled.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sync"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

func main() {
	merchants := flag.Int("merchants", 1000, "merchants to settle")
	workers := flag.Int("workers", 8, "workers, each owning the merchants whose hash mod workers is its index")
	down := flag.Int("down", -1, "a worker that never starts, to show its share waiting (-1: none)")
	date := flag.String("date", "2026-09-30", "settlement date")
	flag.Parse()
	dir, err := os.MkdirTemp("", "partition-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	cfg := Config{Path: filepath.Join(dir, "ledger.db"), Merchants: *merchants, Workers: *workers, Date: *date}
	if *down >= 0 {
		cfg.Down = []int{*down}
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		fail(err)
	}
	fmt.Printf(`partition report (no lock: each merchant has one owner)
  %d workers, %d merchants, all started at once
  settled          %d / %d
  duplicates       %d
  settled by a non-owner %d
  per worker       %v
  unsettled        %d   (owner ran: must be 0)
  waiting          %d   (owned by down workers %v)
`, rep.Workers, rep.Merchants, rep.Settled, rep.Merchants, rep.Duplicates, rep.WrongOwner, rep.PerWorker, rep.Missing, rep.Waiting, cfg.Down)
	if rep.Duplicates != 0 || rep.WrongOwner != 0 || rep.Missing != 0 {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "partition:", err)
	os.Exit(1)
}

// Config is one run.
type Config struct {
	Path      string // SQLite file, created when missing
	Merchants int    // merchants m00000 … to settle
	Workers   int    // W: every worker must be given the same W
	Date      string // settlement date
	Down      []int  // workers that do not run (a dead pod)
}

// Report is what a run counts, read back from the ledger.
type Report struct {
	Merchants  int
	Workers    int
	Settled    int   // distinct merchants with a settlement row
	Duplicates int   // rows beyond one per merchant
	WrongOwner int   // rows written by a worker that does not own the merchant
	PerWorker  []int // settlements written by each worker
	Waiting    int   // merchants left unsettled whose owner is down
	Missing    int   // merchants left unsettled whose owner ran (a bug)
}

// Owner is the index of the worker that owns merchant among workers. FNV-1a
// is the same in every process and every Go version (unlike hash/maphash or
// map order), so every worker computes the same owner.
func Owner(merchant string, workers int) int {
	h := fnv.New32a()
	h.Write([]byte(merchant))
	return int(h.Sum32() % uint32(workers))
}

func merchantName(i int) string { return fmt.Sprintf("m%05d", i) }

// Run starts every worker not in cfg.Down at the same moment, each with its
// own database connection as a pod would have, and reports from the ledger.
// The settlements table has no unique constraint on purpose: nothing but
// the partition keeps a merchant from being settled twice.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Merchants <= 0 || cfg.Workers <= 0 {
		return Report{}, fmt.Errorf("--merchants and --workers must be positive (got %d, %d)", cfg.Merchants, cfg.Workers)
	}
	db, err := openSQLite(cfg.Path)
	if err != nil {
		return Report{}, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS settlements (
		merchant TEXT NOT NULL, date TEXT NOT NULL, worker INT NOT NULL)`); err != nil {
		return Report{}, fmt.Errorf("migrate: %w", err)
	}
	down := map[int]bool{}
	for _, d := range cfg.Down {
		down[d] = true
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, cfg.Workers)
	for i := range cfg.Workers {
		if down[i] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := RunWorker(ctx, cfg.Path, i, cfg.Workers, cfg.Merchants, cfg.Date); err != nil {
				errs[i] = fmt.Errorf("worker %d: %w", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Report{}, err
	}
	return count(ctx, db, cfg)
}

// RunWorker is worker index of workers: it settles every merchant it owns
// that is not settled yet (so a restarted worker finishes its share), and
// nothing else. No other worker writes these merchants, so the check and
// the insert need no lock.
func RunWorker(ctx context.Context, path string, index, workers, merchants int, date string) error {
	db, err := openSQLite(path)
	if err != nil {
		return err
	}
	defer db.Close()
	for m := range merchants {
		merchant := merchantName(m)
		if Owner(merchant, workers) != index {
			continue
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM settlements WHERE merchant = $1 AND date = $2`, merchant, date).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO settlements (merchant, date, worker) VALUES ($1, $2, $3)`, merchant, date, index); err != nil {
			return err
		}
	}
	return nil
}

func count(ctx context.Context, db *sql.DB, cfg Config) (Report, error) {
	rep := Report{Merchants: cfg.Merchants, Workers: cfg.Workers, PerWorker: make([]int, cfg.Workers)}
	rows, err := db.QueryContext(ctx, `SELECT merchant, worker FROM settlements WHERE date = $1`, cfg.Date)
	if err != nil {
		return Report{}, err
	}
	defer rows.Close()
	seen := map[string]bool{}
	for rows.Next() {
		var merchant string
		var worker int
		if err := rows.Scan(&merchant, &worker); err != nil {
			return Report{}, err
		}
		if seen[merchant] {
			rep.Duplicates++
		}
		seen[merchant] = true
		if worker < 0 || worker >= cfg.Workers || Owner(merchant, cfg.Workers) != worker {
			rep.WrongOwner++
		} else {
			rep.PerWorker[worker]++
		}
	}
	if err := rows.Err(); err != nil {
		return Report{}, err
	}
	rep.Settled = len(seen)
	down := map[int]bool{}
	for _, d := range cfg.Down {
		down[d] = true
	}
	for m := range cfg.Merchants {
		switch merchant := merchantName(m); {
		case seen[merchant]:
		case down[Owner(merchant, cfg.Workers)]:
			rep.Waiting++
		default:
			rep.Missing++
		}
	}
	return rep, nil
}

// openSQLite opens an embedded SQLite file as examples/settlement does: WAL,
// a busy timeout so concurrent writers wait for each other, and
// transactions that take the write lock when they begin.
func openSQLite(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one connection per worker, as a pod would have
	return db, nil
}
