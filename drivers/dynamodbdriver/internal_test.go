package dynamodbdriver

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/dlock-dev/dlock/driver"
)

// TestObservations_FirstSightingCounts: the time kept is the first read
// that showed a version; a new version starts over; forgetting drops it.
func TestObservations_FirstSightingCounts(t *testing.T) {
	var o observations
	t0 := time.Now()
	if got := o.see("k", "v1", time.Second, t0); !got.Equal(t0) {
		t.Fatalf("first sighting = %v, want %v", got, t0)
	}
	if got := o.see("k", "v1", time.Second, t0.Add(time.Second)); !got.Equal(t0) {
		t.Fatalf("same version seen again = %v, want the first sighting %v", got, t0)
	}
	if got := o.see("k", "v2", time.Second, t0.Add(2*time.Second)); !got.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("a new version = %v, want its own sighting", got)
	}
	if ob, ok := o.get("k"); !ok || ob.rvn != "v2" || ob.lease != time.Second {
		t.Fatalf("get = %+v, %v", ob, ok)
	}
	o.forget("k")
	if _, ok := o.get("k"); ok {
		t.Fatal("forgotten observation still there")
	}
}

// TestObservations_PrunedWhenLarge: past maxObservations, entries nobody
// looked at for pruneAfter are dropped; recent ones stay.
func TestObservations_PrunedWhenLarge(t *testing.T) {
	var o observations
	for i := range maxObservations {
		o.see(fmt.Sprint(i), "v", time.Second, time.Now())
	}
	o.mu.Lock()
	for _, ob := range o.m {
		ob.used = time.Now().Add(-2 * pruneAfter)
	}
	o.m["0"].used = time.Now()
	o.mu.Unlock()
	o.see("new", "v", time.Second, time.Now())
	if n := o.len(); n != 2 {
		t.Fatalf("%d observations after pruning, want 2 (the recent one and the new one)", n)
	}
}

func TestContainsName_WholeNamesOnly(t *testing.T) {
	for _, tc := range []struct {
		expr, alias string
		want        bool
	}{
		{"#owner = :o", "#owner", true},
		{"attribute_not_exists(#owner)", "#owner", true},
		{"#fence < #cap", "#cap", true},
		{"#owner_new = :o", "#owner", false},
		{"SET #k = :k", "#k", true},
		{"SET #kx = :k", "#k", false},
	} {
		if got := containsName(tc.expr, tc.alias); got != tc.want {
			t.Errorf("containsName(%q, %q) = %v, want %v", tc.expr, tc.alias, got, tc.want)
		}
	}
}

// TestParseState_RefusesForeignItems: an item that is not a lock item (no
// record version, a held item without a lease, a number that is not one)
// is an error, never a free key.
func TestParseState_RefusesForeignItems(t *testing.T) {
	for _, item := range []map[string]types.AttributeValue{
		{"k": str("x"), "fence": num(1)},
		{"k": str("x"), "rvn": str("v"), "owner": str("o"), "fence": num(1), "fence_cap": num(3)},
		{"k": str("x"), "rvn": str("v"), "fence": &types.AttributeValueMemberN{Value: "1.5"}},
	} {
		if st, err := parseState(item, time.Now()); err == nil {
			t.Errorf("parseState(%v) = %+v, want an error", item, st)
		}
	}
	st, err := parseState(nil, time.Now())
	if err != nil || !st.missing {
		t.Fatalf("parseState(nil) = %+v, %v; want missing", st, err)
	}
}

// TestStoreErr_Classifies: DynamoDB's refusals of the request are invalid
// input, of the credentials permission denied, and anything else a store
// error (ErrUnavailable at the root).
func TestStoreErr_Classifies(t *testing.T) {
	api := func(code string) error { return &smithy.GenericAPIError{Code: code, Message: "m"} }
	for _, tc := range []struct {
		err           error
		invalid, deny bool
	}{
		{api("ValidationException"), true, false},
		{api("ResourceNotFoundException"), true, false},
		{api("AccessDeniedException"), true, true},
		{api("UnrecognizedClientException"), true, true},
		{api("ProvisionedThroughputExceededException"), false, false},
		{api("ThrottlingException"), false, false},
		{api("InternalServerError"), false, false},
		{errors.New("dial tcp: connection refused"), false, false},
	} {
		err := storeErr("op", tc.err)
		if errors.Is(err, driver.ErrInvalidArgument) != tc.invalid || errors.Is(err, driver.ErrPermissionDenied) != tc.deny {
			t.Errorf("storeErr(%v) = %v: invalid %v denied %v, want %v %v", tc.err, err,
				errors.Is(err, driver.ErrInvalidArgument), errors.Is(err, driver.ErrPermissionDenied), tc.invalid, tc.deny)
		}
		if !errors.Is(err, tc.err) || !strings.HasPrefix(err.Error(), "dynamodbdriver: op") {
			t.Errorf("storeErr(%v) = %q: does not wrap the cause or name the driver", tc.err, err)
		}
	}
}

// TestEpochKey_NoLockKeyCanNameIt: the epoch counter's key is longer than
// any valid lock key.
func TestEpochKey_NoLockKeyCanNameIt(t *testing.T) {
	if err := driver.CheckKey(epochKey); !errors.Is(err, driver.ErrInvalidKey) {
		t.Fatalf("the epoch key is a valid lock key (%d bytes): %v", len(epochKey), err)
	}
	if len(epochKey) > 2048 {
		t.Fatalf("the epoch key is %d bytes, over DynamoDB's 2048", len(epochKey))
	}
	if maxEpoch()<<epochBits+(1<<epochBits-1) >= 1<<63 {
		t.Fatal("fences can reach 2^63")
	}
}
