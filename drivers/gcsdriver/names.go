package gcsdriver

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// Object names.
//
// A key's record is the object PREFIX + escape(key). Cloud Storage takes any
// UTF-8 in an object name except carriage return and line feed, and
// advises against other control characters; a name may not be "." or ".."
// nor start with ".well-known/acme-challenge/", and is at most 1024 bytes.
// escape therefore writes as %XX (per UTF-8 byte) only: '%' itself, the C0
// and C1 control characters and DEL, and a '.' that starts the key; every
// other character, '/' included, is kept. Escaping is per character and
// the same for a key and for any of its prefixes, so a key prefix maps to
// an object-name prefix (List lists by it).
//
// A key whose name would pass 1024 bytes (at most 512 bytes of key, but
// every byte may triple) is named by the part of its escaped form that
// fits, cut at a character boundary, then "%~" and the SHA-256 of the key
// in hex. "%~" never occurs in an escaped name ('%' is always followed by
// two hex digits there), so such names cannot meet another key's, and the
// record's own copy of the key (metadata dlock-key) is what List and
// Inspect report and check.

// maxObjectName is Cloud Storage's limit on an object name, in bytes of
// UTF-8.
const maxObjectName = 1024

// hashMark separates a cut name from the key's hash.
const hashMark = "%~"

// maxPrefix bounds the URL's prefix so that every key's name fits.
const maxPrefix = 256

// escapeKey escapes key for an object name (see above).
func escapeKey(key string) string {
	var b strings.Builder
	b.Grow(len(key))
	for i := 0; i < len(key); {
		r, size := utf8.DecodeRuneInString(key[i:])
		if needsEscape(r, i) {
			for j := range size {
				c := key[i+j]
				b.WriteByte('%')
				b.WriteByte(hexDigits[c>>4])
				b.WriteByte(hexDigits[c&0xf])
			}
		} else {
			b.WriteString(key[i : i+size])
		}
		i += size
	}
	return b.String()
}

const hexDigits = "0123456789ABCDEF"

func needsEscape(r rune, at int) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == '%' || (at == 0 && r == '.') || r == utf8.RuneError
}

// cut returns the longest prefix of the escaped string s that is at most n
// bytes and ends between two escaped characters (never inside a %XX nor
// inside a UTF-8 sequence).
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for i < len(s) {
		size := 3 // a %XX
		if s[i] != '%' {
			_, size = utf8.DecodeRuneInString(s[i:])
		}
		if i+size > n {
			break
		}
		i += size
	}
	return s[:i]
}

// objectName returns the name of key's record under prefix.
func objectName(prefix, key string) string {
	esc := escapeKey(key)
	if len(prefix)+len(esc) <= maxObjectName {
		return prefix + esc
	}
	sum := sha256.Sum256([]byte(key))
	budget := maxObjectName - len(prefix) - len(hashMark) - 2*len(sum)
	return prefix + cut(esc, budget) + hashMark + hex.EncodeToString(sum[:])
}

// listPrefix returns the object-name prefix under which every key that
// starts with keyPrefix has its record (see objectName); the records
// found must still be filtered by their own key.
func listPrefix(prefix, keyPrefix string) string {
	// A prefix that ends inside a UTF-8 sequence is cut back to the last
	// whole character: names hold whole characters.
	for len(keyPrefix) > 0 && !utf8.ValidString(keyPrefix) {
		keyPrefix = keyPrefix[:len(keyPrefix)-1]
	}
	budget := maxObjectName - len(prefix) - len(hashMark) - 2*sha256.Size
	return prefix + cut(escapeKey(keyPrefix), budget)
}
