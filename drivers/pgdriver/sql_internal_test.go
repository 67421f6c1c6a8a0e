package pgdriver

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestAcquireSQL_OnlyGrantsWaitForFlush checks the commit mode the acquire
// statement leaves for its transaction: synchronous after a grant, off
// after an attempt that locked the row and then found the key taken.
func TestAcquireSQL_OnlyGrantsWaitForFlush(t *testing.T) {
	pg := testservers.StartPostgres(t)
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(t.Context(), pg.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(t.Context()) })
		return c
	}
	c1, c2 := connect(), connect()
	d, err := New(c1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	mode := func(tx pgx.Tx) string {
		var m string
		if err := tx.QueryRow(t.Context(), "SHOW synchronous_commit").Scan(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	ttl := (time.Minute).Microseconds()

	// tx1 grants k and keeps its transaction open.
	tx1, err := c1.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var fence int64
	var sync string
	if err := tx1.QueryRow(t.Context(), d.sqlAcquire, "k", "owner-a", ttl, "").Scan(&fence, &sync); err != nil {
		t.Fatalf("grant: %v", err)
	}
	if m := mode(tx1); m != "on" {
		t.Fatalf("after a grant, synchronous_commit = %s, want on", m)
	}

	// tx2 does not see tx1's row, passes the pre-check, waits on the
	// unique index for tx1, then finds the key taken.
	type result struct {
		err  error
		mode string
	}
	done := make(chan result, 1)
	go func() {
		tx2, err := c2.Begin(t.Context())
		if err != nil {
			done <- result{err: err}
			return
		}
		var f int64
		var s string
		err = tx2.QueryRow(t.Context(), d.sqlAcquire, "k", "owner-b", ttl, "").Scan(&f, &s)
		var m string
		err2 := tx2.QueryRow(t.Context(), "SHOW synchronous_commit").Scan(&m)
		_ = tx2.Rollback(t.Context()) // before reporting: c2 is closed when the test ends
		if err2 != nil {
			done <- result{err: err2}
			return
		}
		done <- result{err: err, mode: m}
	}()
	// Await tx2 blocked on tx1 (a backend waiting for a lock), not a guessed
	// time: committing earlier would not test the wait.
	c3 := connect() // not c1: tx1 would see one snapshot of pg_stat_activity
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		err := c3.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()").Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tx2 did not block on tx1 within 10 s")
		}
	}
	if err := tx1.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if !errors.Is(r.err, pgx.ErrNoRows) {
		t.Fatalf("second owner's attempt = %v, want no row (not acquired)", r.err)
	}
	if r.mode != "off" {
		t.Fatalf("after a refused attempt, synchronous_commit = %s, want off", r.mode)
	}
}

// TestAcquireSQL_RaisesOffKeepsOtherModes: a session default of off is
// raised to on for grants and renewals; other modes are left as they are.
func TestAcquireSQL_RaisesOffKeepsOtherModes(t *testing.T) {
	pg := testservers.StartPostgres(t)
	c, err := pgx.Connect(t.Context(), pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	d, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	ttl := (time.Minute).Microseconds()
	for i, tc := range []struct{ session, want string }{{"off", "on"}, {"local", "local"}, {"remote_apply", "remote_apply"}} {
		if _, err := c.Exec(t.Context(), "SET synchronous_commit = "+tc.session); err != nil {
			t.Fatal(err)
		}
		for _, stmt := range []string{"acquire", "renew"} {
			tx, err := c.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			key, owner := "k"+tc.session, "owner"
			if stmt == "acquire" {
				var fence int64
				var s string
				err = tx.QueryRow(t.Context(), d.sqlAcquire, key, owner, ttl, "").Scan(&fence, &s)
			} else {
				_, err = tx.Exec(t.Context(), d.sqlRenew, key, owner, ttl)
			}
			if err != nil {
				t.Fatalf("case %d %s: %v", i, stmt, err)
			}
			var m string
			if err := tx.QueryRow(t.Context(), "SHOW synchronous_commit").Scan(&m); err != nil {
				t.Fatal(err)
			}
			if m != tc.want {
				t.Errorf("session %s, after %s: synchronous_commit = %s, want %s", tc.session, stmt, m, tc.want)
			}
			if err := tx.Commit(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
}
