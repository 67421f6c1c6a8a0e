package pgcommon

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestLikePrefix_EscapesMetacharacters(t *testing.T) {
	for in, want := range map[string]string{
		"":        "%",
		"a":       "a%",
		"a%b_c":   `a\%b\_c%`,
		`back\sl`: `back\\sl%`,
	} {
		if got := LikePrefix(in); got != want {
			t.Errorf("LikePrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTakeParams_RemovesDlockParameters(t *testing.T) {
	u, _ := url.Parse("postgres://u@h:5/db?sslmode=disable&dlock_schema=s&dlock_table=t1&dlock_table=t2")
	rest, vals := TakeParams(u, "dlock_schema", "dlock_table", "absent")
	if strings.Contains(rest, "dlock_") || !strings.Contains(rest, "sslmode=disable") {
		t.Errorf("remaining URL %q", rest)
	}
	if vals["dlock_schema"] != "s" || vals["dlock_table"] != "t2" || len(vals) != 2 {
		t.Errorf("values %v", vals)
	}
	if u.RawQuery == "" || !strings.Contains(u.RawQuery, "dlock_schema") {
		t.Errorf("the caller's URL was modified: %q", u.RawQuery)
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"public", `Odd "name"`, "emoji 🔒", strings.Repeat("x", 63)} {
		if err := ValidateName("schema", ok); err != nil {
			t.Errorf("ValidateName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", 64), "a'b", `a\b`, "a\x00b", "\xff"} {
		if err := ValidateName("schema", bad); err == nil {
			t.Errorf("ValidateName(%q) = nil", bad)
		}
	}
}

func TestChannel_FitsIdentifierLimit(t *testing.T) {
	a, b := Channel(Ident("s", "t")), Channel(Ident("s", "u"))
	if a == b || len(a) > 63 || !strings.HasPrefix(a, "dlock_") {
		t.Errorf("channels %q %q", a, b)
	}
}

func TestDetach_IgnoresCancelKeepsLaterDeadline(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	ctx, stop := Detach(parent)
	defer stop()
	cancel()
	if ctx.Err() != nil {
		t.Fatal("detached context ended with its parent")
	}
	if d, ok := ctx.Deadline(); !ok || time.Until(d) < MinDetached-time.Second {
		t.Fatalf("deadline %v, want about %v from now", d, MinDetached)
	}
	long, cancel2 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel2()
	ctx2, stop2 := Detach(long)
	defer stop2()
	if d, _ := ctx2.Deadline(); time.Until(d) < 59*time.Minute {
		t.Fatalf("later parent deadline not kept: %v", d)
	}
}

func TestMigrateLockID_IsDocumentedHash(t *testing.T) {
	sum := sha256.Sum256([]byte("dlock\x00migrate"))
	if want := int64(binary.BigEndian.Uint64(sum[:8])); MigrateLockID != want {
		t.Fatalf("MigrateLockID = %d, want %d", MigrateLockID, want)
	}
}
