// Package pgcommon holds what the two PostgreSQL drivers (pgdriver and
// pgadvisory) share: identifier quoting, concurrency-safe migrations, URL
// parameters, LIKE escaping, and the LISTEN/NOTIFY hub behind their release
// hints.
package pgcommon

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs SQL; *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx
// implement it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// MigrateLockID is the transaction-scoped advisory lock id that serializes
// dlock's DDL, so that concurrent first uses cannot race on CREATE … IF NOT
// EXISTS (which is not safe under concurrency by itself). It is the first 8
// bytes of SHA-256("dlock\x00migrate"), as a big-endian int64. It shares
// the database's advisory lock id space with pgadvisory's keys, whose ids
// hash strings that start with "dlock:", so no key maps to it by
// construction. (Earlier versions hashed "dlock:migrate", which is
// pgadvisory's id of the key "migrate": holding that key blocked every
// migration in the database. During an upgrade, an old and a new client
// can each run a first-use migration at once; one of them may then fail
// once and is retried on its next call.)
const MigrateLockID int64 = -8414651896607302138 // 0x8b3926aeca279e06

// SyncCommitOn is an SQL expression for a statement's RETURNING list (or
// select list) that makes the statement's transaction commit synchronously
// when the session's synchronous_commit is off; other settings (local, on,
// remote_write, remote_apply) are kept. Grants and renewals use it: an
// acknowledged one must survive a crash.
const SyncCommitOn = `set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)`

// maxIdentifier is PostgreSQL's NAMEDATALEN-1: longer names are truncated
// by the server, which would silently merge two names.
const maxIdentifier = 63

// ValidateName reports whether name can be used as a schema or table name:
// 1 to 63 bytes of UTF-8 without NUL, quote or backslash (names are quoted,
// so any other character, case and keyword works).
func ValidateName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s name is empty", kind)
	case len(name) > maxIdentifier:
		return fmt.Errorf("%s name %q is longer than %d bytes", kind, name, maxIdentifier)
	case !utf8.ValidString(name):
		return fmt.Errorf("%s name %q is not valid UTF-8", kind, name)
	case strings.ContainsAny(name, "\x00'\\"):
		return fmt.Errorf("%s name %q contains NUL, a quote or a backslash", kind, name)
	}
	return nil
}

// Ident quotes a possibly qualified identifier: Ident("s", "t") is "s"."t".
func Ident(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// Literal quotes s as an SQL string literal (standard_conforming_strings,
// the default since PostgreSQL 9.1; ValidateName rejects backslashes).
func Literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Migrate runs ddl once the objects are known to be missing: it first asks
// whether every relation in check exists (qualified, quoted names; a
// user without CREATE privilege can then still use tables someone else
// made), and otherwise runs, in one implicit transaction of the simple
// query protocol, pg_advisory_xact_lock(MigrateLockID), CREATE SCHEMA IF NOT
// EXISTS (only when the schema is missing) and ddl.
func Migrate(ctx context.Context, db Execer, schema, ddl string, check ...string) error {
	if len(check) > 0 {
		ok, err := relationsExist(ctx, db, check)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
	}
	return MigrateNow(ctx, db, schema, ddl)
}

// MigrateNow runs the DDL without the existence check (see Migrate).
func MigrateNow(ctx context.Context, db Execer, schema, ddl string) error {
	var schemaExists bool
	if err := db.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&schemaExists); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT pg_advisory_xact_lock(%d);\n", MigrateLockID)
	if !schemaExists {
		fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", Ident(schema))
	}
	b.WriteString(ddl)
	// No arguments: pgx sends it with the simple query protocol, where
	// several statements run as one transaction.
	_, err := db.Exec(ctx, b.String())
	return err
}

func relationsExist(ctx context.Context, db Execer, names []string) (bool, error) {
	var sb strings.Builder
	sb.WriteString("SELECT true")
	args := make([]any, len(names))
	for i, n := range names {
		fmt.Fprintf(&sb, " AND to_regclass($%d) IS NOT NULL", i+1)
		args[i] = n
	}
	var ok bool
	err := db.QueryRow(ctx, sb.String(), args...).Scan(&ok)
	return ok, err
}

// LikePrefix returns a LIKE pattern matching strings that start with
// prefix, with the default escape character (backslash) escaping %, _ and
// backslash.
func LikePrefix(prefix string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(prefix) + "%"
}

// TakeParams removes the named query parameters from u and returns the
// remaining URL as a string for pgx, and the removed values (the last one
// when a parameter repeats).
func TakeParams(u *url.URL, names ...string) (string, map[string]string) {
	q := u.Query()
	vals := map[string]string{}
	for _, n := range names {
		if vs, ok := q[n]; ok {
			if len(vs) > 0 {
				vals[n] = vs[len(vs)-1]
			}
			q.Del(n)
		}
	}
	c := *u
	c.RawQuery = q.Encode()
	return c.String(), vals
}

// IsConnError reports whether err means the connection itself is broken
// (as opposed to an SQL error on a healthy connection).
func IsConnError(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.EqualFold(pgErr.Severity, "FATAL") || strings.EqualFold(pgErr.Severity, "PANIC") ||
			strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	return true
}

// MinDetached is the least time a detached statement is given to finish.
const MinDetached = 5 * time.Second

// Detach returns a context for a statement that must not be abandoned
// half-way (pgx closes a connection whose statement is cancelled, and the
// server may still commit the statement, or drop a session lock, only
// later): it ignores ctx's cancellation, and ends at ctx's deadline or
// MinDetached from now, whichever is later.
func Detach(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(MinDetached)
	if d, ok := ctx.Deadline(); ok && d.After(deadline) {
		deadline = d
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}
