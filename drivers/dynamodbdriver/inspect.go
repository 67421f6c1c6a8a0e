package dynamodbdriver

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dlock-dev/dlock/driver"
)

// info describes a held item.
func (st state) info(key string) driver.HolderInfo {
	h := driver.HolderInfo{Key: key, Fence: st.fence, Holder: st.holder, TTL: st.lease, Waiters: -1}
	if !st.renewed.IsZero() {
		// Display only: the holder's wall clock against this one's.
		h.Remaining = min(max(st.renewed.Add(st.lease).Sub(time.Now()), 0), st.lease)
	}
	return h
}

// Inspect implements driver.Inspector with a strongly consistent read of
// key's item. Remaining is an estimate from the holder's wall clock at its
// last write (clamped to [0, TTL]), for display only: a holder that died
// shows 0 until a waiter takes the key over. Waiters is -1.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("dynamodbdriver: inspect: %w", err)
	}
	if d.closed.Load() {
		return driver.HolderInfo{}, driver.ErrClosed
	}
	st, err := d.read(ctx, key)
	if err != nil {
		return driver.HolderInfo{}, storeErr("inspect", err)
	}
	if st.missing || st.owner == "" {
		return driver.HolderInfo{Key: key, Waiters: -1}, fmt.Errorf("dynamodbdriver: inspect %q: %w", key, driver.ErrNotAcquired)
	}
	return st.info(key), nil
}

// List implements driver.Inspector: the held keys that start with prefix,
// sorted by key bytes, from a strongly consistent Scan of the whole table
// (filtered on the server; it reads, and is billed for, every item).
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	if d.closed.Load() {
		return nil, driver.ErrClosed
	}
	filter := "attribute_exists(#owner)"
	var values map[string]types.AttributeValue
	if prefix != "" {
		filter += " AND begins_with(#k, :prefix)"
		values = map[string]types.AttributeValue{":prefix": str(prefix)}
	}
	in := &dynamodb.ScanInput{
		TableName:                 aws.String(d.table),
		ConsistentRead:            aws.Bool(true),
		FilterExpression:          aws.String(filter),
		ExpressionAttributeNames:  namesFor(filter),
		ExpressionAttributeValues: values,
	}
	var out []driver.HolderInfo
	for {
		page, err := d.api.Scan(ctx, in)
		if err != nil {
			return nil, storeErr("list", err)
		}
		now := time.Now()
		for _, item := range page.Items {
			k, ok := item[attrKey].(*types.AttributeValueMemberS)
			if !ok {
				continue
			}
			st, err := parseState(item, now)
			if err != nil {
				return nil, fmt.Errorf("dynamodbdriver: list: key %q: %w", k.Value, err)
			}
			if st.owner != "" {
				out = append(out, st.info(k.Value))
			}
		}
		if len(page.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// ForceRelease implements driver.ForceReleaser: it reads key's item and
// marks it free with a write conditioned on the record version it read, so
// a renewal or another grant in between is never undone (the call then
// fails and can be run again). The fence is kept: the next grant's is
// greater. reason is not stored (DynamoDB keeps no log of its own).
func (d *Driver) ForceRelease(ctx context.Context, key, reason string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("dynamodbdriver: force-release: %w", err)
	}
	if d.closed.Load() {
		return driver.HolderInfo{}, driver.ErrClosed
	}
	st, err := d.read(ctx, key)
	if err != nil {
		return driver.HolderInfo{}, storeErr("force-release", err)
	}
	if st.missing || st.owner == "" {
		return driver.HolderInfo{}, fmt.Errorf("dynamodbdriver: force-release %q: %w", key, driver.ErrNotAcquired)
	}
	_, err = d.api.UpdateItem(ctx, d.releaseInput(key, condVersion(st.rvn, true)))
	if isConditionFailed(err) {
		return driver.HolderInfo{}, fmt.Errorf("dynamodbdriver: force-release %q: the key was renewed or changed hands while it was being released; nothing was changed, run it again", key)
	}
	if err != nil {
		return driver.HolderInfo{}, storeErr("force-release", err)
	}
	d.seen.forget(key)
	return st.info(key), nil
}
