// Package authtoken makes and hashes dlockd bearer tokens, the one way the
// server (its --auth-file) and the dlock CLI (dlock token new, dlock token
// hash) agree on.
//
// A token is 256 random bits from crypto/rand, written as Prefix followed by
// 43 characters of unpadded base64url. The auth file stores only Hash(token),
// the lower-case hex SHA-256 of the token's bytes.
//
// # Why SHA-256 and not a password hash
//
// bcrypt, scrypt and Argon2 are slow on purpose, to make guessing a
// low-entropy password from its hash expensive. A token made by New has
// 256 bits of entropy: no guess succeeds however fast each try is, so a
// slow hash would only cost every request its time (a password hash is
// tens of milliseconds, on every call) and buy nothing. A plain SHA-256
// is one-way, fast, and constant in length, so the server compares hashes
// in constant time. A token a person chose (short, guessable) must not be
// used: make them with New.
package authtoken

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
)

// Prefix starts every token New makes, so that secret scanners and people
// recognise one in a file or a paste.
const Prefix = "dlk_"

// New returns a fresh token: Prefix and 32 random bytes in unpadded
// base64url (47 characters in all). It fails only when the system's random
// source does.
func New() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("dlock: token: read random bytes: %w", err)
	}
	return Prefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Hash returns the lower-case hex SHA-256 (64 characters) of token's bytes:
// what the auth file stores for it.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}
