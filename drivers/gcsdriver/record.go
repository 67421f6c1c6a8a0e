package gcsdriver

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"cloud.google.com/go/storage"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// The record of a key is an empty object whose custom metadata holds the
// lease. Every change to it is a whole new object generation, written
// with the precondition ifGenerationMatch on the generation the writer
// read (0 for the first write of a key: the object must not exist).
const (
	metaKey     = "dlock-key"     // the key, as the caller gave it
	metaOwner   = "dlock-owner"   // the owner token; absent when free
	metaFence   = "dlock-fence"   // the fence of the current (or last) grant
	metaTTL     = "dlock-ttl-us"  // the holder's lease, in microseconds; absent when free
	metaHolder  = "dlock-holder"  // the holder description; absent when empty or free
	metaVersion = "dlock-version" // 64 random bits, new in every write
)

// record is a key's record as read.
type record struct {
	key        string
	generation int64
	owner      string // "" when free
	fence      uint64
	ttl        time.Duration
	holder     string
	version    string // the generation and the random version: what a waiter observes
}

// held reports whether the record names a holder.
func (r record) held() bool { return r.owner != "" }

// parseRecord reads a record from an object's attributes. An object under
// the prefix that is not a record of key (another program's object, or a
// record of another key that collides, which SHA-256 makes impossible in
// practice) is refused as invalid: the driver never overwrites it.
func parseRecord(key string, a *storage.ObjectAttrs) (record, error) {
	m := a.Metadata
	r := record{
		key:        m[metaKey],
		generation: a.Generation,
		owner:      m[metaOwner],
		holder:     m[metaHolder],
		version:    strconv.FormatInt(a.Generation, 10) + "/" + m[metaVersion],
	}
	bad := func(why string) (record, error) {
		return record{}, urlparam.Invalid("gcsdriver: object %q in bucket %q is not a dlock record of key %q: %s", a.Name, a.Bucket, key, why)
	}
	if r.key != key {
		return bad(fmt.Sprintf("its %s is %q", metaKey, r.key))
	}
	if a.Generation <= 0 {
		return bad("no generation")
	}
	// The fence: as written, else (the record's first write, which could
	// not know it) the generation of that write.
	if f, ok := m[metaFence]; ok {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil || n == 0 {
			return bad(fmt.Sprintf("%s %q", metaFence, f))
		}
		r.fence = n
	} else {
		r.fence = uint64(a.Generation)
	}
	if r.owner != "" {
		us, err := strconv.ParseInt(m[metaTTL], 10, 64)
		if err != nil || us <= 0 {
			return bad(fmt.Sprintf("%s %q", metaTTL, m[metaTTL]))
		}
		r.ttl = time.Duration(us) * time.Microsecond
		if err := driver.CheckTTL(r.ttl); err != nil {
			return bad(err.Error())
		}
	}
	return r, nil
}

// grantMeta returns the metadata of a record held by owner. fence 0 leaves
// the fence out: the record's first write, whose fence is its generation.
func grantMeta(key, owner string, fence uint64, ttl time.Duration, holder string) map[string]string {
	m := map[string]string{
		metaKey:     key,
		metaOwner:   owner,
		metaTTL:     strconv.FormatInt(micros(ttl), 10),
		metaVersion: newVersion(),
	}
	if fence != 0 {
		m[metaFence] = strconv.FormatUint(fence, 10)
	}
	if holder != "" {
		m[metaHolder] = holder
	}
	return m
}

// freeMeta returns the metadata of a free record that keeps fence.
func freeMeta(key string, fence uint64) map[string]string {
	return map[string]string{
		metaKey:     key,
		metaFence:   strconv.FormatUint(fence, 10),
		metaVersion: newVersion(),
	}
}

func micros(d time.Duration) int64 { return int64((d + time.Microsecond - 1) / time.Microsecond) }

func newVersion() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// info describes a held record.
func (r record) info(remaining time.Duration) driver.HolderInfo {
	return driver.HolderInfo{
		Key: r.key, Fence: r.fence, Holder: r.holder, TTL: r.ttl,
		Remaining: remaining, Waiters: -1,
	}
}
