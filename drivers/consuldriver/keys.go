package consuldriver

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Reserved directories under the prefix (see "Layout" in the package doc).
const (
	locksDir = ".locks"
	queueDir = ".queue"
)

// escapeKey escapes a lock name (or an owner token) into one Consul KV path
// element: ASCII letters, digits, '-' and '_' stay, every other byte is
// %XX (upper-case hex). The result never contains '/', never starts with
// '.', and is never "." or "..", so it cannot change the path's shape
// (Consul's HTTP API would clean "." and ".." elements) or reach a reserved
// name; and escaping is byte-wise, so a key's prefix escapes to a prefix of
// the key's escape (List relies on it).
func escapeKey(k string) string {
	var b strings.Builder
	b.Grow(len(k))
	for i := 0; i < len(k); i++ {
		c := k[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// unescapeKey reverses escapeKey; ok is false for a string escapeKey never
// returns (an entry someone else wrote under the prefix).
func unescapeKey(s string) (string, bool) {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", false
		}
		b.WriteByte(hi<<4 | lo)
		i += 2
	}
	return b.String(), true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// record is the JSON value of a lock entry and of a queue entry.
type record struct {
	Owner  string `json:"owner"`
	Holder string `json:"holder,omitempty"`
	TTLns  int64  `json:"ttl_ns"`
}

func encodeRecord(owner, holder string, ttl time.Duration) []byte {
	b, _ := json.Marshal(record{Owner: owner, Holder: holder, TTLns: int64(ttl)})
	return b
}

// decodeRecord parses an entry's value; ok is false for a value the driver
// did not write.
func decodeRecord(v []byte) (record, bool) {
	var r record
	if len(v) == 0 || json.Unmarshal(v, &r) != nil || r.Owner == "" {
		return record{}, false
	}
	return r, true
}
