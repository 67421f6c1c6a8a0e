package sqlledger_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/recipe/once/sqlledger"
)

// TestOpen_SQLitePathMistakesAreInvalid: a SQLite path that is a
// directory, or in a directory that does not exist (or in a file), is a
// mistake in the DSN (ErrInvalidArgument, exit 64 in the CLI), not an
// unavailable database; a new file in an existing directory opens.
func TestOpen_SQLitePathMistakesAreInvalid(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dsn := range []string{
		"sqlite:" + dir,
		"sqlite://" + dir,
		"file:" + dir + "?mode=rwc",
		"sqlite:" + filepath.Join(dir, "missing", "x.db"),
		"sqlite:" + filepath.Join(file, "x.db"),
	} {
		l, err := sqlledger.Open(t.Context(), dsn)
		if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("Open(%q) = %v; want ErrInvalidArgument", dsn, err)
		}
		if l != nil {
			_ = l.Close()
		}
	}
	l, err := sqlledger.Open(t.Context(), "sqlite:"+filepath.Join(dir, "new.db"))
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
}
