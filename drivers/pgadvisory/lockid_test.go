package pgadvisory_test

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/dlock-dev/dlock/drivers/pgadvisory"
)

// TestDriver_LockIDIsDocumentedHash: the default key table keeps the ids of
// earlier versions (LockID); any other table hashes its qualified name in.
func TestDriver_LockIDIsDocumentedHash(t *testing.T) {
	hash := func(s string) int64 {
		sum := sha256.Sum256([]byte(s))
		return int64(binary.BigEndian.Uint64(sum[:8]))
	}
	for _, tc := range []struct {
		opts  *pgadvisory.Options
		table string // qualified and quoted; "" for the default
	}{
		{nil, ""},
		{&pgadvisory.Options{Schema: "public", Table: "dlock_advisory"}, ""},
		{&pgadvisory.Options{Schema: "a"}, `"a"."dlock_advisory"`},
		{&pgadvisory.Options{Table: "other"}, `"public"."other"`},
		{&pgadvisory.Options{Schema: `odd "s"`, Table: "t"}, `"odd ""s"""."t"`},
	} {
		d, err := pgadvisory.New(nil, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"k", "a", "emoji 🔒"} {
			want := pgadvisory.LockID(k)
			if tc.table != "" {
				want = hash("dlock:" + tc.table + "\x00" + k)
			}
			if got := d.LockID(k); got != want {
				t.Errorf("%+v: LockID(%q) = %d, want %d", tc.opts, k, got, want)
			}
		}
		_ = d.Close()
	}
}
