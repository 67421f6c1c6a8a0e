package urlparam

import (
	"strings"
	"testing"
)

// TestRedactString: passwords and secret-looking parameters are masked in
// parsed and unparsable URLs alike; other parameters are kept.
func TestRedactString(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:pw1@h/db?password=pw2&sslmode=disable": "postgres://u:xxxxx@h/db?password=xxxxx&sslmode=disable",
		"redis://:pw3@h:6379/0":                              "redis://:xxxxx@h:6379/0",
		"dlockd://h:7450?token=pw4":                          "dlockd://h:7450?token=xxxxx",
		"etcd://h:2379/team":                                 "etcd://h:2379/team",
	} {
		if got := RedactString(in); got != want {
			t.Errorf("RedactString(%q) = %q, want %q", in, got, want)
		}
	}
	// Does not parse (bad escape), still masked.
	got := RedactString("postgres://u:pw5@h/db?password=pw6%zz")
	if strings.Contains(got, "pw5") || strings.Contains(got, "pw6") {
		t.Errorf("RedactString of an unparsable URL = %q: a secret shows", got)
	}
}
