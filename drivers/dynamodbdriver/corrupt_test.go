package dynamodbdriver_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dynamodbdriver"
)

// wantPermanent fails t unless err says the store's data is at fault:
// ErrInvalidArgument, never ErrUnavailable (WithFailOpen would then run
// the job unlocked on a fault that retrying cannot mend).
func wantPermanent(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("%s = %v; want ErrInvalidArgument (a permanent fault), not ErrUnavailable", what, err)
	}
}

// testFaultCorruptItemIsPermanent: an item the driver did not write (an
// attribute of the wrong type, a number that does not parse, no record
// version) is refused with ErrInvalidArgument by every call that reads
// it, directly and through the root package, and is never overwritten.
func testFaultCorruptItemIsPermanent(t *testing.T, s *store) {
	d := s.open(t)
	l := dlock.New(d)
	t.Cleanup(func() { _ = l.Close() })
	n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
	sv := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	for _, tc := range []struct {
		name string
		item map[string]types.AttributeValue
	}{
		{"LeaseIsAString", map[string]types.AttributeValue{"owner": sv("someone"), "rvn": sv("r1"), "fence": n("3"), "fence_cap": n("100"), "lease_ns": sv("10s")}},
		{"OwnerIsANumber", map[string]types.AttributeValue{"owner": n("7"), "rvn": sv("r1"), "fence": n("3"), "fence_cap": n("100"), "lease_ns": n("10000000000")}},
		{"FenceBeyond64Bits", map[string]types.AttributeValue{"rvn": sv("r1"), "fence": n("99999999999999999999"), "fence_cap": n("100")}},
		{"NoRecordVersion", map[string]types.AttributeValue{"fence": n("3"), "fence_cap": n("100")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "corrupt/" + tc.name
			tc.item["k"] = sv(key)
			_, err := s.client(t, nil).PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(s.table), Item: tc.item})
			if err != nil {
				t.Fatal(err)
			}
			before := s.item(t, key)
			r := req(key, "o-"+tc.name, 10*time.Second)
			g, err := d.TryAcquire(t.Context(), r)
			wantPermanent(t, "TryAcquire", err)
			if err == nil {
				t.Errorf("TryAcquire granted a corrupt item: fence %d", g.Fence)
			}
			_, err = d.Inspect(t.Context(), key)
			wantPermanent(t, "Inspect", err)
			_, err = d.ForceRelease(t.Context(), key, "test")
			wantPermanent(t, "ForceRelease", err)
			if _, held := tc.item["owner"]; held { // List scans held items only
				_, err = d.List(t.Context(), key)
				wantPermanent(t, "List", err)
			}
			_, err = l.TryAcquire(t.Context(), key)
			if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
				t.Errorf("Locker.TryAcquire = %v; want ErrInvalidArgument, not ErrUnavailable", err)
			}
			if after := s.item(t, key); len(after) != len(before) {
				t.Errorf("the corrupt item was rewritten: %v, was %v", after, before)
			}
		})
	}
}

// testFenceEpochsExhaustedIsPermanent: once the table's fence epoch
// counter passes the greatest epoch, no greater fence can be issued: a
// new key's grant is refused with ErrInvalidArgument (move to a new
// table), never ErrUnavailable, and so is a counter of the wrong type.
func testFenceEpochsExhaustedIsPermanent(t *testing.T, s *store) {
	d := s.open(t)
	put := func(v types.AttributeValue) {
		t.Helper()
		_, err := s.client(t, nil).PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(s.table), Item: map[string]types.AttributeValue{
			"k": &types.AttributeValueMemberS{Value: dynamodbdriver.EpochKey}, "epoch": v,
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	maxEpoch := uint64(1)<<(63-dynamodbdriver.EpochBits()) - 1
	put(&types.AttributeValueMemberN{Value: strconv.FormatUint(maxEpoch, 10)})
	_, err := d.TryAcquire(t.Context(), req("epochs/exhausted", "o1", 10*time.Second))
	wantPermanent(t, "TryAcquire with the fence epochs exhausted", err)
	put(&types.AttributeValueMemberS{Value: "not a number"})
	_, err = d.TryAcquire(t.Context(), req("epochs/string", "o2", 10*time.Second))
	wantPermanent(t, "TryAcquire with an epoch counter of the wrong type", err)
}
