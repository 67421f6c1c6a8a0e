package bench

import "testing"

// TestRedact: progress lines and reports never show a store's password.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://:secret@127.0.0.1:6379/0?prefix=x":      "redis://:xxxxx@127.0.0.1:6379/0?prefix=x",
		"postgres://app:pw@db:5432/app?dlock_table=t":    "postgres://app:xxxxx@db:5432/app?dlock_table=t",
		"dlockd://127.0.0.1:7450":                        "dlockd://127.0.0.1:7450",
		"etcd://127.0.0.1:2379/dlock-bench-0123456789ab": "etcd://127.0.0.1:2379/dlock-bench-0123456789ab",
		"::not a url": "::not a url",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
