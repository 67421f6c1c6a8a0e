package pgadvisory

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/pgcommon"
)

// defaultTable is the qualified, quoted name of the default key table,
// "public"."dlock_advisory", whose lock ids are LockID's.
var defaultTable = pgcommon.Ident(DefaultSchema, DefaultTable)

// LockID returns the advisory lock id that d takes for key. For the default
// key table ("public"."dlock_advisory") it is the package's LockID(key),
// the id of every earlier version. For any other key table it is the first
// 8 bytes of SHA-256("dlock:" + T + "\x00" + key), as a big-endian int64,
// where T is the table's qualified name as PostgreSQL quotes it (for
// Options{Schema: "locks"}: "locks"."dlock_advisory", with the double
// quotes). Advisory lock ids are shared by the whole database, so the
// table's name in the hash keeps drivers with different schemas or tables
// from taking each other's ids; and since a key has no NUL, the preimages
// of the two forms never coincide, so only a 64-bit hash collision (about
// n²/2⁶⁵ for n keys in use at once) can make two drivers' keys share an id.
// pg_locks shows the id as classid (high 32 bits) and objid (low 32 bits)
// with objsubid 1.
func (d *Driver) LockID(key string) int64 {
	if d.table == defaultTable {
		return LockID(key)
	}
	return hashID("dlock:" + d.table + "\x00" + key)
}

// hashID returns the first 8 bytes of SHA-256(s) as a big-endian int64.
func hashID(s string) int64 {
	sum := sha256.Sum256([]byte(s))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// inspectSQL returns the statement of Inspect: $1 lock id, $2 key. It
// starts from pg_locks, not from the key table, so that a lock id held by
// a session without a grant of the key in this table (a hash collision,
// another key table or schema, other code, an old client during an
// upgrade) still shows as held. cols is the column list of a key table row
// aliased k, joined with pg_stat_activity a (see buildSQL); they are NULL
// when the holder has no row.
func (d *Driver) inspectSQL(cols string) string {
	return `WITH p AS (
	SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1
)
SELECT p.pid, ` + cols + `
FROM p LEFT JOIN ` + d.table + ` k ON k.lock_id = $1 AND k.pid = p.pid
	LEFT JOIN pg_stat_activity a ON a.pid = k.pid
ORDER BY (k.key = $2::text) DESC NULLS LAST
LIMIT 1`
}

// inspect runs Inspect's statement on c. It returns pgx.ErrNoRows when key's
// lock id is free.
func (d *Driver) inspect(ctx context.Context, c *pgxpool.Conn, key string) (driver.HolderInfo, error) {
	id := d.LockID(key)
	var (
		pid              int32
		k, holder        *string
		fence, ttl, left *int64
		info             = driver.HolderInfo{Key: key, Waiters: -1}
	)
	if err := c.QueryRow(ctx, d.sqlInspect, id, key).Scan(&pid, &k, &fence, &holder, &ttl, &left); err != nil {
		return driver.HolderInfo{}, err
	}
	if k != nil && *k == key && fence != nil && holder != nil && ttl != nil && left != nil {
		info.Fence = uint64(*fence)
		info.Holder = *holder
		info.TTL = time.Duration(*ttl) * time.Microsecond
		info.Remaining = time.Duration(*left) * time.Microsecond
		return info, nil
	}
	// Held, but not by a grant of key in this table: the key cannot be
	// acquired, so it is not reported free.
	info.Holder = fmt.Sprintf("PostgreSQL backend pid %d holds advisory lock id %d without a grant of this key in %s", pid, id, d.table)
	if k != nil {
		info.Holder += fmt.Sprintf(" (it holds it for the key %q: a hash collision)", *k)
	} else {
		info.Holder += " (another key table or schema, an earlier dlock version, other code taking advisory locks, or a grant not yet committed)"
	}
	return info, nil
}
