// Command idempotent pays vendors with no lock at all: the payout is made
// idempotent, so running it twice does no harm. Each payment has a key derived
// from the work itself (payout:2026-09:v007, never a fresh UUID per attempt);
// one transaction inserts the key into a table where it is the primary key and
// moves the money, so a second application finds the key and moves nothing.
// Two workers that both run the payout, each retrying every payment whose answer
// it never got, move each amount exactly once. See docs/CHOOSING.md.
//
//	go run ./examples/idempotent                 # 2 workers, 2 retries each, 20 vendors, SQLite in a temp dir
//	go run ./examples/idempotent --no-key        # the same without the key table: money moves 6 times
//
// It exits 1 unless every vendor was paid exactly its amount.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

func main() {
	vendors := flag.Int("vendors", 20, "vendors to pay")
	workers := flag.Int("workers", 2, "workers that all run the whole payout")
	retries := flag.Int("retries", 2, "times each worker applies each payment again, as after a lost answer")
	month := flag.String("month", "2026-09", "payout month")
	noKey := flag.Bool("no-key", false, "apply without the idempotency key table (what the key prevents)")
	flag.Parse()
	dir, err := os.MkdirTemp("", "idempotent-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	cfg := Config{Path: filepath.Join(dir, "ledger.db"), Vendors: *vendors, Workers: *workers, Retries: *retries, Month: *month, NoKey: *noKey}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		fail(err)
	}
	mode := "idempotency key per payment"
	if cfg.NoKey {
		mode = "NO idempotency key"
	}
	fmt.Printf(`idempotent report (%s)
  %d workers × %d attempts × %d payments = %d applications
  applied          %d   (money moved)
  already applied  %d   (key found: nothing moved)
  vendors paid exactly once %d / %d, paid more %d
  treasury         %d cents, want %d
`, mode, rep.Workers, 1+rep.Retries, rep.Vendors, rep.Applications, rep.Applied, rep.AlreadyApplied,
		rep.PaidOnce, rep.Vendors, rep.PaidMore, rep.TreasuryCents, rep.WantTreasuryCents)
	if rep.PaidOnce != rep.Vendors || rep.TreasuryCents != rep.WantTreasuryCents {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "idempotent:", err)
	os.Exit(1)
}

// Treasury is the account every payout is paid from, and its opening
// balance in cents.
const (
	Treasury             = "treasury"
	TreasuryOpeningCents = 100_000_000
)

// Payment is one vendor's payout for a month. Key names the work, so every
// worker and every retry computes the same key for the same payment.
type Payment struct {
	Key         string
	Vendor      string
	AmountCents int64
}

// Payments is the month's payout: the same list on every worker.
func Payments(month string, vendors int) []Payment {
	ps := make([]Payment, vendors)
	for i := range ps {
		v := fmt.Sprintf("v%03d", i)
		ps[i] = Payment{Key: "payout:" + month + ":" + v, Vendor: v, AmountCents: 10_000 + int64(i)*137}
	}
	return ps
}

// Apply makes payment p once, whoever calls it and however often: in one
// transaction it records p.Key (the primary key of idempotency_keys, so a
// second insert of it does nothing) and, only when the key is new, moves the
// money. It reports whether this call moved the money. With noKey it moves
// the money every time: what Apply would be without the table.
func Apply(ctx context.Context, db *sql.DB, p Payment, worker int, noKey bool) (applied bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	if !noKey {
		res, err := tx.ExecContext(ctx,
			`INSERT INTO idempotency_keys (key, amount_cents, worker) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING`,
			p.Key, p.AmountCents, worker)
		if err != nil {
			return false, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return false, err // already applied, here or by another worker
		}
	}
	for _, move := range []struct {
		account string
		delta   int64
	}{{Treasury, -p.AmountCents}, {p.Vendor, p.AmountCents}} {
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO accounts (account, balance_cents) VALUES ($1, $2)
			 ON CONFLICT (account) DO UPDATE SET balance_cents = accounts.balance_cents + excluded.balance_cents`,
			move.account, move.delta); err != nil {
			return false, err
		}
	}
	return true, tx.Commit()
}

// Config is one run.
type Config struct {
	Path    string // SQLite file, created when missing
	Vendors int
	Workers int    // workers that each run the whole payout, at the same moment
	Retries int    // extra applications of each payment by each worker
	Month   string // payout month, part of every key
	NoKey   bool   // apply without the idempotency key (to show the harm)
}

// Report counts the applications as the workers saw them and the balances
// as the ledger holds them.
type Report struct {
	Vendors, Workers, Retries, Applications int
	Applied, AlreadyApplied                 int64
	PaidOnce, PaidMore                      int // vendors whose balance is exactly their amount, or more
	TreasuryCents, WantTreasuryCents        int64
}

// Run starts cfg.Workers workers at the same moment, each with its own
// connection as a pod would have, each applying every payment 1+cfg.Retries
// times, and reads the balances back.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Vendors <= 0 || cfg.Workers <= 0 || cfg.Retries < 0 {
		return Report{}, fmt.Errorf("--vendors and --workers must be positive and --retries not negative (got %d, %d, %d)", cfg.Vendors, cfg.Workers, cfg.Retries)
	}
	db, err := openSQLite(cfg.Path)
	if err != nil {
		return Report{}, err
	}
	defer db.Close()
	if err := migrate(ctx, db); err != nil {
		return Report{}, err
	}
	payments := Payments(cfg.Month, cfg.Vendors)
	var applied, already atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, cfg.Workers)
	for w := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wdb, err := openSQLite(cfg.Path)
			if err != nil {
				errs[w] = err
				return
			}
			defer wdb.Close()
			<-start
			for _, p := range payments {
				for range 1 + cfg.Retries {
					ok, err := Apply(ctx, wdb, p, w, cfg.NoKey)
					if err != nil {
						errs[w] = fmt.Errorf("worker %d, %s: %w", w, p.Key, err)
						return
					}
					if ok {
						applied.Add(1)
					} else {
						already.Add(1)
					}
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Report{}, err
	}
	rep := Report{Vendors: cfg.Vendors, Workers: cfg.Workers, Retries: cfg.Retries,
		Applications: cfg.Vendors * cfg.Workers * (1 + cfg.Retries),
		Applied:      applied.Load(), AlreadyApplied: already.Load(), WantTreasuryCents: TreasuryOpeningCents}
	for _, p := range payments {
		var bal int64
		err := db.QueryRowContext(ctx, `SELECT coalesce(max(balance_cents), 0) FROM accounts WHERE account = $1`, p.Vendor).Scan(&bal)
		if err != nil {
			return Report{}, err
		}
		switch {
		case bal == p.AmountCents:
			rep.PaidOnce++
		case bal > p.AmountCents:
			rep.PaidMore++
		}
		rep.WantTreasuryCents -= p.AmountCents
	}
	err = db.QueryRowContext(ctx, `SELECT balance_cents FROM accounts WHERE account = $1`, Treasury).Scan(&rep.TreasuryCents)
	return rep, err
}

func migrate(ctx context.Context, db *sql.DB) error {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS accounts (
			account       TEXT   PRIMARY KEY,
			balance_cents BIGINT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS idempotency_keys (
			key          TEXT   PRIMARY KEY,
			amount_cents BIGINT NOT NULL,
			worker       INT    NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	_, err := db.ExecContext(ctx, `INSERT INTO accounts (account, balance_cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		Treasury, TreasuryOpeningCents)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
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
