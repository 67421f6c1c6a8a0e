package redisdriver

import "strings"

// Key layout. For a lock name K under the prefix P, with e(s) the escaping
// below:
//
//	e(P):{e(K)}:lock      hash {owner, fence, holder, ttl}, expiring after ttl
//	e(P):{e(K)}:fence     integer fence counter, never expiring
//	e(P):{e(K)}:released  pub/sub channel of release hints
//
// The escaping replaces '%', '{' and '}' by "%25", "%7B" and "%7D". Escaped
// strings contain no braces, so the first '{' of a Redis key is the one the
// driver wrote, and the Redis Cluster hash tag (the text between the first
// '{' and the first '}' after it) is exactly e(K): a lock's hash and its
// fence counter always share a slot. e is injective (every byte other than
// the three maps to itself, and the three codes start with the only byte
// that is never kept as is), so distinct names never share keys, and the
// prefix keeps them apart from an application's own data.

var (
	escaper   = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
	unescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")
	// globEscaper quotes the characters that SCAN MATCH patterns treat
	// specially.
	globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
)

const (
	lockSuffix    = "}:lock"
	fenceSuffix   = "}:fence"
	channelSuffix = "}:released"
)

func escape(s string) string   { return escaper.Replace(s) }
func unescape(s string) string { return unescaper.Replace(s) }

// keys returns the Redis names of the lock hash, the fence counter and the
// release channel of key.
func (d *Driver) keys(key string) (lock, fence, channel string) {
	base := d.ns + ":{" + escape(key)
	return base + lockSuffix, base + fenceSuffix, base + channelSuffix
}

// lockPattern returns the SCAN MATCH pattern of the lock hashes whose
// names start with prefix.
func (d *Driver) lockPattern(prefix string) string {
	return globEscaper.Replace(d.ns+":{"+escape(prefix)) + "*" + lockSuffix
}

// keyOfLock returns the lock name of a lock hash's Redis name, or false
// when the name is not one of this driver's lock hashes.
func (d *Driver) keyOfLock(redisKey string) (string, bool) {
	head := d.ns + ":{"
	if !strings.HasPrefix(redisKey, head) || !strings.HasSuffix(redisKey, lockSuffix) {
		return "", false
	}
	esc := redisKey[len(head) : len(redisKey)-len(lockSuffix)]
	if esc == "" || strings.ContainsAny(esc, "{}") {
		return "", false
	}
	return unescape(esc), true
}
