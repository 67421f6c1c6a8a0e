package gcsdriver

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestObjectName_Escaping: only '%', control characters and a leading '.'
// are escaped; everything else, '/' included, is kept.
func TestObjectName_Escaping(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"a/b/c", "locks/a/b/c"},
		{"with space", "locks/with space"},
		{"a%b", "locks/a%25b"},
		{"a%2Fb", "locks/a%252Fb"},
		{"\n\t", "locks/%0A%09"},
		{"x\x7fy", "locks/x%7Fy"},
		{"x\u0085y", "locks/x%C2%85y"}, // C1 control (NEL)
		{".", "locks/%2E"},
		{"..", "locks/%2E."},
		{"a..b", "locks/a..b"},
		{".well-known/acme-challenge/x", "locks/%2Ewell-known/acme-challenge/x"},
		{"emoji 🔒", "locks/emoji 🔒"},
		{"*?[]#{}", "locks/*?[]#{}"},
	} {
		if got := objectName("locks/", tc.key); got != tc.want {
			t.Errorf("objectName(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// TestObjectName_LongKeysFit: every key of up to 512 bytes gets a valid
// name of at most 1024 bytes, distinct keys distinct names, and a name
// that had to be cut still starts with the listing prefix of each of the
// key's prefixes.
func TestObjectName_LongKeysFit(t *testing.T) {
	prefix := strings.Repeat("p", maxPrefix-1) + "/"
	keys := []string{
		strings.Repeat("%", 512),
		strings.Repeat("%", 511) + "a",
		strings.Repeat("\n", 512),
		strings.Repeat("🔒", 128),
		strings.Repeat("x", 508) + "🔒",
		strings.Repeat("\u0085", 256),
		"." + strings.Repeat("%", 511),
	}
	seen := map[string]string{}
	for _, k := range keys {
		for _, p := range []string{"", "locks/", prefix} {
			n := objectName(p, k)
			if len(n) > maxObjectName || !utf8.ValidString(n) || strings.ContainsAny(n, "\r\n") {
				t.Fatalf("objectName(%q, %d-byte key) = %d bytes, valid %v", p, len(k), len(n), utf8.ValidString(n))
			}
			if other, dup := seen[n]; dup && other != k {
				t.Fatalf("keys %q and %q share the name %q", other, k, n)
			}
			seen[n] = k
			for i := 0; i <= len(k); i++ {
				if !utf8.ValidString(k[:i]) {
					continue
				}
				if lp := listPrefix(p, k[:i]); !strings.HasPrefix(n, lp) {
					t.Fatalf("name %q of key %q does not start with the listing prefix %q of %q", n, k, lp, k[:i])
				}
			}
		}
	}
}

// TestObjectName_PrefixesMapToPrefixes: for random keys (with the
// characters that are escaped), the listing prefix of any prefix of a key
// is a prefix of the key's name.
func TestObjectName_PrefixesMapToPrefixes(t *testing.T) {
	alphabet := []string{"a", "/", "%", ".", "\n", "é", "🔒", "\u0085", " ", "~"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var b strings.Builder
		n := 1 + r.IntN(40)
		for range n {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		k := b.String()
		name := objectName("l/", k)
		for i := 0; i <= len(k); i++ {
			if utf8.ValidString(k[:i]) && !strings.HasPrefix(name, listPrefix("l/", k[:i])) {
				t.Fatalf("key %q: name %q does not start with listPrefix(%q) = %q", k, name, k[:i], listPrefix("l/", k[:i]))
			}
		}
	}
}

func TestCleanPrefix(t *testing.T) {
	for in, want := range map[string]string{"": "", "locks": "locks/", "locks/": "locks/", "a/b": "a/b/", "é/x": "é/x/"} {
		if got, err := cleanPrefix(in); err != nil || got != want {
			t.Errorf("cleanPrefix(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"/abs", "a/../b", "./a", "a\nb", "a\x00b", "\xff", ".well-known/acme-challenge/x", strings.Repeat("p", maxPrefix)} {
		if got, err := cleanPrefix(bad); err == nil {
			t.Errorf("cleanPrefix(%q) = %q, want an error", bad, got)
		}
	}
}

func TestCheckBucket(t *testing.T) {
	for _, ok := range []string{"abc", "my-bucket", "my_bucket.example.com", strings.Repeat("a", 63), "a1b"} {
		if err := checkBucket(ok); err != nil {
			t.Errorf("checkBucket(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "ab", "Upper", "-lead", "trail-", strings.Repeat("a", 64), "a..b", "has space", "a/b", "é-bucket"} {
		if err := checkBucket(bad); err == nil {
			t.Errorf("checkBucket(%q) accepted", bad)
		}
	}
}
