package dlockddriver

import (
	"crypto/rand"
	"encoding/hex"
)

// newSession returns a 128-bit random session ID, hex-encoded.
func newSession() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
