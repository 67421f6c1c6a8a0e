package pgcommon

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestRefused_Classes(t *testing.T) {
	cases := []struct {
		code string
		want bool
	}{
		{"22P02", true},  // invalid text representation
		{"28P01", true},  // invalid password
		{"3D000", true},  // invalid catalog name (no such database)
		{"3F000", true},  // invalid schema name
		{"42501", true},  // insufficient privilege
		{"42P01", true},  // undefined table
		{"54000", true},  // program limit exceeded
		{"08006", false}, // connection failure
		{"40001", false}, // serialization failure
		{"40P01", false}, // deadlock
		{"53300", false}, // too many connections
		{"57P01", false}, // admin shutdown
		{"57014", false}, // query canceled
		{"25006", false}, // read-only standby
		{"", false},
		{"4", false},
	}
	for _, c := range cases {
		err := fmt.Errorf("op: %w", &pgconn.PgError{Code: c.code})
		if got := Refused(err); got != c.want {
			t.Errorf("Refused(SQLSTATE %q) = %v, want %v", c.code, got, c.want)
		}
	}
	for _, err := range []error{nil, errors.New("42P01"), context.DeadlineExceeded} {
		if Refused(err) {
			t.Errorf("Refused(%v) = true for an error that is not a PostgreSQL answer", err)
		}
	}
}
