package pgdriver_test

import (
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/pgdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestOpen_InvalidURLIsInvalidArgument: URLs that the driver, pgx or a real
// PostgreSQL refuse (a bad port, an unknown setting, an unknown role or
// database, an invalid table name) match driver.ErrInvalidArgument, never
// driver.ErrUnavailable (which would let WithFailOpen run work unlocked).
func TestOpen_InvalidURLIsInvalidArgument(t *testing.T) {
	pg := testservers.StartPostgres(t)
	base := pg.URL() // postgres://postgres@127.0.0.1:port/postgres?sslmode=disable
	urls := []string{
		"postgres://postgres@127.0.0.1:99999/postgres?sslmode=disable",
		"postgres://postgres@127.0.0.1:0/postgres?sslmode=disable",
		"postgres://postgres@127.0.0.1:/postgres?sslmode=disable", // an empty port (issue 13 F5)
		base + "&sslmode=sometimes",
		base + "&pool_max_conns=many",
		base + "&no_such_setting=1",
		strings.Replace(base, "postgres@", "nobody@", 1),
		strings.Replace(base, "/postgres?", "/no_such_db?", 1),
		base + "&dlock_table=" + strings.Repeat("t", 64),
		"pgadvisory" + strings.TrimPrefix(base, "postgres"),
	}
	dlocktest.OpenRefuses(t, pgdriver.Open, urls...)
	dlocktest.RootOpenNotUnavailable(t, urls...)
}
