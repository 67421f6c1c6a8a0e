package dynamodbdriver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// Attribute names of a lock item. Expressions always refer to them through
// ExpressionAttributeNames (#k, #owner, …), so DynamoDB's reserved words
// (OWNER is one) never matter.
const (
	attrKey     = "k"          // partition key: the lock key (S)
	attrOwner   = "owner"      // owner token of the grant; absent when free (S)
	attrRVN     = "rvn"        // record version, new on every write (S)
	attrFence   = "fence"      // fence of the last grant (N)
	attrCap     = "fence_cap"  // greatest fence of the current epoch (N)
	attrLease   = "lease_ns"   // the holder's TTL, in nanoseconds (N)
	attrHolder  = "holder"     // holder description (S)
	attrRenewed = "renewed_ms" // the holder's wall clock at its last write, Unix ms (N); display only
	attrGC      = "gc_at"      // free items only, with GCAfter: TTL deletion time, Unix s (N)
	attrEpoch   = "epoch"      // the epoch item's counter (N)
)

// epochKey is the key of the item that counts fence epochs: longer than
// MaxKeyBytes, so no lock key can name it, and without an owner, so List
// never shows it.
var epochKey = func() string {
	s := "dlock internal: fence epoch counter (longer than any lock key, so no lock key can name it) "
	return s + strings.Repeat(".", 600-len(s))
}()

// epochBits is the number of low bits of a fence that count grants within
// one epoch (a variable so that tests can exhaust an epoch quickly).
var epochBits uint = 24

// maxEpoch is the greatest epoch that keeps fences below 2^63.
func maxEpoch() uint64 { return 1<<(63-epochBits) - 1 }

// names is every attribute name an expression may use.
var names = map[string]string{
	"#k": attrKey, "#owner": attrOwner, "#rvn": attrRVN, "#fence": attrFence, "#cap": attrCap,
	"#lease": attrLease, "#holder": attrHolder, "#renewed": attrRenewed, "#gc": attrGC,
}

// namesFor returns the entries of names that expr uses (DynamoDB refuses
// unused names).
func namesFor(exprs ...string) map[string]string {
	out := map[string]string{}
	for alias, name := range names {
		for _, e := range exprs {
			if containsName(e, alias) {
				out[alias] = name
				break
			}
		}
	}
	return out
}

// containsName reports whether expr uses alias as a whole name.
func containsName(expr, alias string) bool {
	for i := 0; ; {
		j := strings.Index(expr[i:], alias)
		if j < 0 {
			return false
		}
		end := i + j + len(alias)
		if end == len(expr) || !isNameByte(expr[end]) {
			return true
		}
		i = end
	}
}

func isNameByte(c byte) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }
func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
func unum(n uint64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatUint(n, 10)}
}

func keyOf(key string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrKey: str(key)}
}

// cond is a condition expression with its values.
type cond struct {
	expr   string
	values map[string]types.AttributeValue
}

// Conditions of the writes.
var (
	// condFree: an existing item that is free, has a record version (an
	// item without one is not this driver's: the read that follows the
	// refusal reports it) and whose epoch has fences left (the cheap first
	// attempt on a key this driver has not seen held).
	condFree = cond{expr: "attribute_exists(#k) AND attribute_not_exists(#owner) AND attribute_exists(#rvn) AND #fence < #cap"}
	// condMissing: no item (a new key, or one deleted by TTL).
	condMissing = cond{expr: "attribute_not_exists(#k)"}
)

// condOwner: the item names owner.
func condOwner(owner string) cond {
	return cond{expr: "#owner = :owner", values: map[string]types.AttributeValue{":owner": str(owner)}}
}

// condVersion: the item still has record version rvn (nothing was written
// since it was read), and, unless rebase, fences left in its epoch.
func condVersion(rvn string, rebase bool) cond {
	c := cond{expr: "#rvn = :seen", values: map[string]types.AttributeValue{":seen": str(rvn)}}
	if !rebase {
		c.expr += " AND #fence < #cap"
	}
	return c
}

// update builds an UpdateItemInput on key from an update expression, a
// condition and their values.
func (d *Driver) update(key, expr string, c cond, values map[string]types.AttributeValue) *dynamodb.UpdateItemInput {
	vals := map[string]types.AttributeValue{}
	for k, v := range values {
		vals[k] = v
	}
	for k, v := range c.values {
		vals[k] = v
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                           aws.String(d.table),
		Key:                                 keyOf(key),
		UpdateExpression:                    aws.String(expr),
		ConditionExpression:                 aws.String(c.expr),
		ExpressionAttributeNames:            namesFor(expr, c.expr),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if len(vals) > 0 {
		in.ExpressionAttributeValues = vals
	}
	return in
}

// grantInput is the write that grants key to req under c. With base > 0
// the item starts a new epoch: fence = base, fence_cap = the epoch's last
// fence; otherwise the fence is ADDed 1. It returns the new fence
// (UPDATED_NEW).
func (d *Driver) grantInput(req driver.AcquireRequest, c cond, base, capFence uint64) *dynamodb.UpdateItemInput {
	set := "SET #owner = :owner_new, #rvn = :rvn, #lease = :lease, #holder = :holder, #renewed = :now"
	values := map[string]types.AttributeValue{
		":owner_new": str(req.Owner), ":rvn": str(newRVN()), ":lease": num(int64(req.TTL)),
		":holder": str(req.Holder), ":now": num(time.Now().UnixMilli()),
	}
	expr := set
	if base > 0 {
		expr += ", #fence = :base, #cap = :cap REMOVE #gc"
		values[":base"], values[":cap"] = unum(base), unum(capFence)
	} else {
		expr += " REMOVE #gc ADD #fence :one"
		values[":one"] = num(1)
	}
	in := d.update(req.Key, expr, c, values)
	in.ReturnValues = types.ReturnValueUpdatedNew
	return in
}

func (d *Driver) renewInput(key, owner string, ttl time.Duration) *dynamodb.UpdateItemInput {
	return d.update(key, "SET #rvn = :rvn, #lease = :lease, #renewed = :now", condOwner(owner), map[string]types.AttributeValue{
		":rvn": str(newRVN()), ":lease": num(int64(ttl)), ":now": num(time.Now().UnixMilli()),
	})
}

// releaseInput marks key free under c, keeping fence and fence_cap.
func (d *Driver) releaseInput(key string, c cond) *dynamodb.UpdateItemInput {
	expr := "SET #rvn = :rvn"
	values := map[string]types.AttributeValue{":rvn": str(newRVN())}
	if d.gcAfter > 0 {
		expr += ", #gc = :gc"
		values[":gc"] = num(time.Now().Add(d.gcAfter).Unix())
	}
	expr += " REMOVE #owner, #holder, #lease, #renewed"
	return d.update(key, expr, c, values)
}

// state is a lock item as read.
type state struct {
	missing  bool
	owner    string // "" when free
	rvn      string
	fence    uint64
	capFence uint64
	lease    time.Duration
	holder   string
	renewed  time.Time // the holder's wall clock at its last write
	readAt   time.Time // this process's clock when the read returned
}

// exhausted reports whether the item's epoch has no fence left.
func (s state) exhausted() bool { return s.fence >= s.capFence }

// corrupt returns the error of an item (or an answer about one) that is
// not what this driver writes: an attribute of the wrong type, a number
// that does not parse, a missing record version, a fence that cannot
// advance. It is a permanent fault of the table's data, not an outage, so
// it matches driver.ErrInvalidArgument (retrying cannot help; WithFailOpen
// never runs work because of it) and never driver.ErrUnavailable.
func corrupt(format string, a ...any) error {
	return urlparam.Invalid("dynamodbdriver: "+format+" (a permanent fault of the table's data, not an outage: repair or delete the item)", a...)
}

// avType names the type of an attribute value as DynamoDB does (S, N, …).
func avType(v types.AttributeValue) string {
	switch v.(type) {
	case *types.AttributeValueMemberS:
		return "S"
	case *types.AttributeValueMemberN:
		return "N"
	case *types.AttributeValueMemberB:
		return "B"
	case *types.AttributeValueMemberBOOL:
		return "BOOL"
	case *types.AttributeValueMemberNULL:
		return "NULL"
	case *types.AttributeValueMemberL:
		return "L"
	case *types.AttributeValueMemberM:
		return "M"
	case *types.AttributeValueMemberSS:
		return "SS"
	case *types.AttributeValueMemberNS:
		return "NS"
	case *types.AttributeValueMemberBS:
		return "BS"
	}
	return fmt.Sprintf("%T", v)
}

// avTypeOf is avType that names a missing value "missing".
func avTypeOf(v types.AttributeValue) string {
	if v == nil {
		return "missing"
	}
	return avType(v)
}

// parseState decodes a lock item. An item that is not one this driver
// wrote (see corrupt) is an error matching driver.ErrInvalidArgument: an
// attribute present with the wrong type is never read as absent (an owner
// stored as a number would otherwise make a held key look free).
func parseState(item map[string]types.AttributeValue, readAt time.Time) (state, error) {
	s := state{readAt: readAt}
	if len(item) == 0 {
		s.missing = true
		return s, nil
	}
	key := "?"
	if k, ok := item[attrKey].(*types.AttributeValueMemberS); ok {
		key = k.Value
	}
	var err error
	fail := func(e error) {
		if err == nil {
			err = e
		}
	}
	getS := func(name string) string {
		switch v := item[name].(type) {
		case nil:
			return ""
		case *types.AttributeValueMemberS:
			return v.Value
		default:
			fail(corrupt("item %q: attribute %s is of type %s, want S", key, name, avType(v)))
			return ""
		}
	}
	getN := func(name string) int64 {
		switch v := item[name].(type) {
		case nil:
			return 0
		case *types.AttributeValueMemberN:
			n, perr := strconv.ParseInt(v.Value, 10, 64)
			if perr != nil {
				fail(corrupt("item %q: attribute %s = %q is not a 64-bit integer", key, name, v.Value))
			}
			return n
		default:
			fail(corrupt("item %q: attribute %s is of type %s, want N", key, name, avType(v)))
			return 0
		}
	}
	s.owner, s.rvn, s.holder = getS(attrOwner), getS(attrRVN), getS(attrHolder)
	fence, capFence := getN(attrFence), getN(attrCap)
	s.lease = time.Duration(getN(attrLease))
	if ms := getN(attrRenewed); ms > 0 {
		s.renewed = time.UnixMilli(ms)
	}
	getN(attrGC) // only checked: DynamoDB's TTL attribute, never read
	if err != nil {
		return state{}, err
	}
	if s.rvn == "" || fence < 0 || capFence < 0 || (s.owner != "" && s.lease <= 0) {
		return state{}, corrupt("item %q is not a dlock lock item (rvn %q, fence %d, fence_cap %d, lease %v)", key, s.rvn, fence, capFence, s.lease)
	}
	s.fence, s.capFence = uint64(fence), uint64(capFence)
	return s, nil
}

// read returns key's item, strongly consistent.
func (d *Driver) read(ctx context.Context, key string) (state, error) {
	out, err := d.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(d.table), Key: keyOf(key), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return state{}, err
	}
	return parseState(out.Item, time.Now())
}

// isConditionFailed reports whether err is DynamoDB refusing a write's
// condition.
func isConditionFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	return errors.As(err, &ccf)
}

// refusedState returns the item a refused write found, when DynamoDB sent
// it back (ReturnValuesOnConditionCheckFailure ALL_OLD; emulators may
// not, and a missing item comes back empty too, so an empty one is read
// again).
func refusedState(err error) (state, bool) {
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) || len(ccf.Item) == 0 {
		return state{}, false
	}
	s, perr := parseState(ccf.Item, time.Now())
	return s, perr == nil
}

// grantedFence returns the fence an UPDATED_NEW grant returned.
func grantedFence(out *dynamodb.UpdateItemOutput) (uint64, error) {
	v, ok := out.Attributes[attrFence].(*types.AttributeValueMemberN)
	if !ok {
		return 0, corrupt("a grant returned no numeric fence (%s)", avTypeOf(out.Attributes[attrFence]))
	}
	f, err := strconv.ParseUint(v.Value, 10, 64)
	if err != nil || f == 0 {
		return 0, corrupt("a grant returned fence %q", v.Value)
	}
	return f, nil
}

// errRefused is a grant write whose condition DynamoDB refused.
var errRefused = errors.New("condition refused")

// grant sends the grant write of req under c (a new epoch when rebase) and
// returns the grant, or errRefused joined with the refused write's error,
// or a store error.
func (d *Driver) grant(ctx context.Context, req driver.AcquireRequest, c cond, rebase bool) (driver.Grant, error) {
	var base, capFence uint64
	if rebase {
		drawn := time.Now()
		e, err := d.drawEpoch(ctx)
		if err != nil {
			return driver.Grant{}, err
		}
		// A creation sent long after its epoch was drawn could land after
		// a later epoch's item was created, used and deleted: never send
		// one more than a minute after the draw (see MinGCAfter).
		if time.Since(drawn) > time.Minute {
			return driver.Grant{}, fmt.Errorf("dynamodbdriver: acquire: the fence epoch draw took %v; not creating the item with a stale epoch", time.Since(drawn).Round(time.Millisecond))
		}
		base = e<<epochBits + 1
		capFence = e<<epochBits + (1<<epochBits - 1)
	}
	out, err := d.api.UpdateItem(ctx, d.grantInput(req, c, base, capFence))
	if isConditionFailed(err) {
		return driver.Grant{}, errors.Join(errRefused, err)
	}
	if err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	f, err := grantedFence(out)
	if err != nil {
		return driver.Grant{}, err
	}
	d.seen.forget(req.Key)
	return driver.Grant{Fence: f}, nil
}

// drawEpoch takes the next fence epoch from the table's counter.
func (d *Driver) drawEpoch(ctx context.Context) (uint64, error) {
	out, err := d.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(d.table),
		Key:                       keyOf(epochKey),
		UpdateExpression:          aws.String("ADD #e :one"),
		ExpressionAttributeNames:  map[string]string{"#e": attrEpoch},
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": num(1)},
		ReturnValues:              types.ReturnValueUpdatedNew,
	})
	if err != nil {
		return 0, storeErr("acquire: drawing a fence epoch", err)
	}
	v, ok := out.Attributes[attrEpoch].(*types.AttributeValueMemberN)
	if !ok {
		return 0, corrupt("the fence epoch counter returned no numeric value (%s)", avTypeOf(out.Attributes[attrEpoch]))
	}
	e, err := strconv.ParseUint(v.Value, 10, 64)
	if err != nil || e == 0 {
		return 0, corrupt("the fence epoch counter returned %q", v.Value)
	}
	if e > maxEpoch() {
		return 0, corrupt("fence epochs exhausted (%d > %d): no greater fence can be issued; move to a new table", e, maxEpoch())
	}
	return e, nil
}

// tryAcquire is one acquisition attempt (see TryAcquire).
func (d *Driver) tryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	var (
		st    state
		known bool
	)
	obs, seen := d.seen.get(req.Key)
	switch {
	case !seen:
		// Not seen held: try the cheap grant of a free item.
		g, err := d.grant(ctx, req, condFree, false)
		if !errors.Is(err, errRefused) {
			return g, err
		}
		st, known = refusedState(err)
	case time.Since(obs.at) >= obs.lease:
		// Seen held with this record version for a full lease: take over.
		g, err := d.grant(ctx, req, condVersion(obs.rvn, false), false)
		if !errors.Is(err, errRefused) {
			return g, err
		}
		st, known = refusedState(err)
	}
	if !known {
		var err error
		if st, err = d.read(ctx, req.Key); err != nil {
			return driver.Grant{}, storeErr("acquire", err)
		}
	}
	return d.decide(ctx, req, st)
}

// decide acts on key's item as read: grants a missing or free item with a
// write conditioned on what was read, adopts a grant of req's own owner
// token (an earlier attempt's write whose reply was lost), and takes over
// a holder whose record version this driver has seen unchanged for a full
// lease. Otherwise the key is held: driver.ErrNotAcquired.
func (d *Driver) decide(ctx context.Context, req driver.AcquireRequest, st state) (driver.Grant, error) {
	var c cond
	switch {
	case st.missing:
		c = condMissing
	case st.owner == req.Owner:
		// Ours already. Renew it, so that its lease runs from a write
		// sent after this attempt began (the root measures validity from
		// the attempt's start).
		if err := d.Renew(ctx, req.Key, req.Owner, req.TTL); err != nil {
			if errors.Is(err, driver.ErrLeaseLost) {
				return driver.Grant{}, driver.ErrNotAcquired
			}
			return driver.Grant{}, err
		}
		d.seen.forget(req.Key)
		return driver.Grant{Fence: st.fence}, nil
	case st.owner == "":
		c = condVersion(st.rvn, st.exhausted())
	default:
		first := d.seen.see(req.Key, st.rvn, st.lease, st.readAt)
		if time.Since(first) < st.lease {
			return driver.Grant{}, driver.ErrNotAcquired
		}
		c = condVersion(st.rvn, st.exhausted())
	}
	g, err := d.grant(ctx, req, c, st.missing || st.exhausted())
	if errors.Is(err, errRefused) {
		// Someone wrote the item since it was read: it is, or was just,
		// held by another. Look again on the next attempt.
		d.seen.forget(req.Key)
		return driver.Grant{}, driver.ErrNotAcquired
	}
	return g, err
}
