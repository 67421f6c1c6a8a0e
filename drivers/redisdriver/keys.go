package redisdriver

import (
	"strconv"
	"strings"
	"sync"
)

// Key layout. For a lock name K under the prefix P, with e(s) the escaping
// below and slot(s) the Redis Cluster hash slot of s (CRC16 of s modulo
// 16384):
//
//	e(P):{e(K)}:lock      hash {owner, fence, holder, ttl}, expiring after ttl
//	e(P):{t(S)}:fences    shared fence counter of slot S = slot(e(K)), never expiring
//	e(P):{e(K)}:released  pub/sub channel of release hints
//	e(P):{e(K)}:queue     list of the owner tokens of queued waiters, FIFO
//	e(P):{e(K)}:waiting   hash: queued owner token -> "deadline ttl n
//	                      channel holder" (see Wait); both expire when no
//	                      waiter refreshes
//	e(P):wake:ID          pub/sub channel of one driver's hand-offs (a Ring
//	                      uses the key's release channel instead)
//	e(P):{e(K)}:fence     legacy per-key fence counter (versions before the
//	                      shared counters); folded into the shared counter
//	                      and deleted by the next acquisition of K, or by
//	                      MigrateFenceCounters
//
// The escaping replaces '%', '{' and '}' by "%25", "%7B" and "%7D". Escaped
// strings contain no braces, so the first '{' of a Redis key is the one the
// driver wrote, and the Redis Cluster hash tag (the text between the first
// '{' and the first '}' after it) is exactly e(K): a lock's hash, its
// channel and its legacy counter always share a slot. e is injective (every
// byte other than the three maps to itself, and the three codes start with
// the only byte that is never kept as is), so distinct names never share
// keys, and the prefix keeps them apart from an application's own data.
//
// t(S) is the decimal form of the smallest non-negative integer n whose
// decimal form Redis Cluster hashes to slot S (slot(t(S)) == S), so the
// shared counter of a lock is in the lock's slot and one script can take
// the lock and raise the counter on Redis Cluster. The table is computed
// once per process (about 110,000 CRC16s) and is the same in every
// client, which is what keeps every client of a key on one counter. Its
// ":fences" suffix keeps it apart from the keys of a lock whose escaped name
// happens to be t(S).

// FenceCounters is the number of shared fence counters a prefix can use on
// one Redis node or cluster (on a Ring, on each shard): one per Redis
// Cluster hash slot. Every lock name maps to the counter of its hash slot,
// so the number of counter keys is bounded by FenceCounters however many
// lock names are ever used.
const FenceCounters = 16384

var (
	escaper   = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
	unescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")
	// globEscaper quotes the characters that SCAN MATCH patterns treat
	// specially.
	globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
)

const (
	lockSuffix          = "}:lock"
	legacyFenceSuffix   = "}:fence"
	sharedCounterSuffix = "}:fences"
	channelSuffix       = "}:released"
	queueSuffix         = "}:queue"
	waitingSuffix       = "}:waiting"
)

func escape(s string) string   { return escaper.Replace(s) }
func unescape(s string) string { return unescaper.Replace(s) }

// keys returns the Redis names of the lock hash, the shared fence counter
// and the release channel of key.
func (d *Driver) keys(key string) (lock, fence, channel string) {
	tag := escape(key)
	base := d.ns + ":{" + tag
	return base + lockSuffix, d.counterKey(slot(tag)), base + channelSuffix
}

// lockKeys returns the Redis names of every key of key's lock, in the order
// of the acquire, wait and release scripts' KEYS: the lock hash, the shared
// fence counter, the legacy per-key counter, the waiter queue and the
// waiters' hash; and the release channel.
//
// The names of recently used keys are cached (up to keyCacheSize keys, then
// the cache starts afresh): a client that takes the same locks again and
// again builds each name once. The returned slice is shared: read only.
func (d *Driver) lockKeys(key string) (keys []string, channel string) {
	if v, ok := d.keyCache.Load(key); ok {
		ks := v.(*keySet)
		return ks.keys, ks.channel
	}
	keys, channel = d.buildLockKeys(key)
	if d.keyCount.Add(1) > keyCacheSize {
		d.keyCache.Clear()
		d.keyCount.Store(0)
	}
	d.keyCache.Store(key, &keySet{keys, channel})
	return keys, channel
}

// keyCacheSize bounds the driver's cache of key names (lockKeys).
const keyCacheSize = 4096

type keySet struct {
	keys    []string
	channel string
}

func (d *Driver) buildLockKeys(key string) (keys []string, channel string) {
	tag := escape(key)
	base := d.ns + ":{" + tag
	return []string{
		base + lockSuffix, d.counterKey(slot(tag)), base + legacyFenceSuffix,
		base + queueSuffix, base + waitingSuffix,
	}, base + channelSuffix
}

// legacyFenceKey returns the Redis name of key's per-key fence counter of
// earlier versions.
func (d *Driver) legacyFenceKey(key string) string {
	return d.ns + ":{" + escape(key) + legacyFenceSuffix
}

// counterKey returns the Redis name of the shared fence counter of slot s.
func (d *Driver) counterKey(s uint16) string {
	return d.ns + ":{" + strconv.FormatUint(uint64(slotTags()[s]), 10) + sharedCounterSuffix
}

// lockPattern returns the SCAN MATCH pattern of the lock hashes whose
// names start with prefix.
func (d *Driver) lockPattern(prefix string) string {
	return globEscaper.Replace(d.ns+":{"+escape(prefix)) + "*" + lockSuffix
}

// legacyFencePattern returns the SCAN MATCH pattern of the legacy per-key
// fence counters.
func (d *Driver) legacyFencePattern() string {
	return globEscaper.Replace(d.ns+":{") + "*" + legacyFenceSuffix
}

// keyOfLock returns the lock name of a lock hash's Redis name, or false
// when the name is not one of this driver's lock hashes.
func (d *Driver) keyOfLock(redisKey string) (string, bool) {
	return d.keyOf(redisKey, lockSuffix)
}

// keyOf returns the lock name of redisKey, one of this driver's keys with
// the given suffix, or false when redisKey is not one.
func (d *Driver) keyOf(redisKey, suffix string) (string, bool) {
	head := d.ns + ":{"
	if !strings.HasPrefix(redisKey, head) || !strings.HasSuffix(redisKey, suffix) ||
		len(redisKey) < len(head)+len(suffix) {
		return "", false
	}
	esc := redisKey[len(head) : len(redisKey)-len(suffix)]
	if esc == "" || strings.ContainsAny(esc, "{}") {
		return "", false
	}
	return unescape(esc), true
}

// slot returns the Redis Cluster hash slot of a key whose hash tag is tag:
// CRC16 (XMODEM, as Redis Cluster's specification defines it) modulo 16384.
func slot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^tag[i]]
	}
	return crc & (FenceCounters - 1)
}

// crcTable is the CRC16 XMODEM table (polynomial 0x1021).
var crcTable = func() [256]uint16 {
	var t [256]uint16
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// slotTags maps each slot S to t(S): the smallest non-negative integer
// whose decimal form hashes to S.
var slotTags = sync.OnceValue(func() *[FenceCounters]uint32 {
	var tags [FenceCounters]uint32
	var seen [FenceCounters]bool
	var buf []byte
	for n, left := uint32(0), FenceCounters; left > 0; n++ {
		buf = strconv.AppendUint(buf[:0], uint64(n), 10)
		s := slot(string(buf))
		if !seen[s] {
			seen[s], tags[s] = true, n
			left--
		}
	}
	return &tags
})
