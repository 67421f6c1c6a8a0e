package pgcommon

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Refused reports whether err is (or wraps) a PostgreSQL error of a class
// that refuses the request or the connection's settings as such: data
// exception (22), invalid authorization (28), invalid database or schema
// name (3D, 3F), syntax error or access rule violation (42: no privilege,
// no such table, an unknown setting) and program limit exceeded (54).
// Connection failures (08), serialization failures and deadlocks (40),
// insufficient resources (53), operator intervention (57: shutdown,
// cancel) and a read-only standby (25006) are not: they are outages. Any
// error that is not a *pgconn.PgError is not refused either.
//
// Both PostgreSQL drivers report a refused answer as
// driver.ErrInvalidArgument (retrying cannot help) and every other failure
// as an outage.
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "28", "3D", "3F", "42", "54":
		return true
	}
	return false
}
