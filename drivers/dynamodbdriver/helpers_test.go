package dynamodbdriver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dynamodbdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// store is one dynalite with one migrated lock table.
type store struct {
	dl    *testservers.Dynalite
	table string
}

var tables atomic.Int64

// newStore returns a new lock table on dl (one per test: fence epochs
// count per table).
func newStore(t *testing.T, dl *testservers.Dynalite) *store {
	t.Helper()
	s := &store{dl: dl, table: fmt.Sprintf("dlock_t%03d", tables.Add(1))}
	migrate(t, s.url())
	return s
}

func (s *store) url() string { return s.dl.URL(s.table) }

// open opens a driver by URL, closed when t ends.
func (s *store) open(t *testing.T) *dynamodbdriver.Driver {
	t.Helper()
	d, err := dynamodbdriver.Open(t.Context(), s.url())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// client returns a DynamoDB client of the emulator over transport rt (nil:
// the default), with the SDK's retries off as the driver's own are.
func (s *store) client(t *testing.T, rt http.RoundTripper) *dynamodb.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	if rt == nil {
		rt = tr
	}
	return dynamodb.New(dynamodb.Options{
		Region:       testservers.DynaliteRegion,
		BaseEndpoint: aws.String(s.dl.Endpoint()),
		Credentials:  credentials.NewStaticCredentialsProvider(testservers.DynaliteAccessKey, testservers.DynaliteSecretKey, ""),
		HTTPClient:   &http.Client{Transport: rt},
		Retryer:      aws.NopRetryer{},
	})
}

// newDriver returns a driver over client (New: a client the caller owns).
func (s *store) newDriver(t *testing.T, client dynamodbdriver.API, opts *dynamodbdriver.Options) *dynamodbdriver.Driver {
	t.Helper()
	d, err := dynamodbdriver.New(client, s.table, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// item reads key's raw item ({} when missing).
func (s *store) item(t *testing.T, key string) map[string]types.AttributeValue {
	t.Helper()
	out, err := s.client(t, nil).GetItem(t.Context(), &dynamodb.GetItemInput{
		TableName: aws.String(s.table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: key}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

// deleteItem deletes key's item, as DynamoDB's TTL (or an operator) would.
func (s *store) deleteItem(t *testing.T, key string) {
	t.Helper()
	_, err := s.client(t, nil).DeleteItem(t.Context(), &dynamodb.DeleteItemInput{
		TableName: aws.String(s.table),
		Key:       map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: key}},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func attrS(item map[string]types.AttributeValue, name string) (string, bool) {
	v, ok := item[name].(*types.AttributeValueMemberS)
	if !ok {
		return "", false
	}
	return v.Value, true
}

func attrN(t *testing.T, item map[string]types.AttributeValue, name string) (int64, bool) {
	t.Helper()
	v, ok := item[name].(*types.AttributeValueMemberN)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		t.Fatalf("attribute %s = %q: %v", name, v.Value, err)
	}
	return n, true
}

func req(key, owner string, ttl time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Holder: "test " + owner}
}

func mustGrant(t *testing.T, d driver.Driver, r driver.AcquireRequest) driver.Grant {
	t.Helper()
	g, err := d.TryAcquire(t.Context(), r)
	if err != nil {
		t.Fatalf("TryAcquire(%q, %s): %v", r.Key, r.Owner, err)
	}
	if g.Fence == 0 {
		t.Fatal("fence 0")
	}
	return g
}

func mustHeld(t *testing.T, d driver.Driver, r driver.AcquireRequest) {
	t.Helper()
	if g, err := d.TryAcquire(t.Context(), r); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q, %s) on a held key = %+v, %v; want ErrNotAcquired", r.Key, r.Owner, g, err)
	}
}

// replyDropper is an HTTP transport that can lose the reply of a request
// after the server has carried it out: the write lands, the client sees
// an error (a timeout, to it). Arm it for the next request of an operation.
type replyDropper struct {
	next  http.RoundTripper
	op    atomic.Value // string: the operation ("UpdateItem") whose next reply is lost; "" none
	drops atomic.Int32
}

var errReplyLost = errors.New("test: reply lost after the server carried the request out")

func (r *replyDropper) arm(op string) { r.op.Store(op) }

func (r *replyDropper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	op, _ := r.op.Load().(string)
	if err != nil || op == "" || !strings.HasSuffix(req.Header.Get("X-Amz-Target"), "."+op) {
		return resp, err
	}
	if !r.op.CompareAndSwap(op, "") {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r.drops.Add(1)
	return nil, errReplyLost
}

func newReplyDropper(t *testing.T) *replyDropper {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	r := &replyDropper{next: tr}
	r.op.Store("")
	return r
}

// ctxFor returns a context bounded by d, ended when t ends.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
