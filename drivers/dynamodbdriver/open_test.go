package dynamodbdriver_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dynamodbdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// testOpenMissingTableSaysHowToCreate: a URL naming a table that does not
// exist is refused as invalid (retrying cannot help), with the ways to
// create it; create_table=true creates it, and Migrate is idempotent.
func testOpenMissingTableSaysHowToCreate(t *testing.T, s *store) {
	missing := s.dl.URL(s.table + "_missing")
	_, err := dynamodbdriver.Open(t.Context(), missing)
	if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("Open of a missing table = %v; want ErrInvalidArgument", err)
	}
	for _, hint := range []string{"does not exist", "Migrate", "create_table=true", "aws dynamodb create-table"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("error %q does not say %q", err, hint)
		}
	}
	if _, err := dlock.Open(t.Context(), missing); !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("dlock.Open of a missing table = %v; want ErrInvalidArgument", err)
	}
	d, err := dynamodbdriver.Open(t.Context(), missing+"&create_table=true")
	if err != nil {
		t.Fatalf("Open with create_table=true: %v", err)
	}
	defer d.Close()
	if err := d.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate of an existing table: %v", err)
	}
	mustGrant(t, d, req("k", ownerA, time.Minute))
	in := d.CreateTableInput()
	if aws.ToString(in.TableName) != s.table+"_missing" || in.BillingMode != types.BillingModePayPerRequest {
		t.Fatalf("CreateTableInput = %+v", in)
	}
}

// testOpenWrongKeySchemaIsRefused: a table of another application (another
// key schema) is refused by name, never written to.
func testOpenWrongKeySchemaIsRefused(t *testing.T, s *store) {
	other := s.table + "_other"
	_, err := s.client(t, nil).CreateTable(t.Context(), &dynamodb.CreateTableInput{
		TableName:            aws.String(other),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{s.dl.URL(other), s.dl.URL(other) + "&create_table=true"} {
		_, err = dynamodbdriver.Open(t.Context(), u)
		if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "key schema") {
			t.Fatalf("Open(%s) = %v; want ErrInvalidArgument naming the key schema", u, err)
		}
	}
}

// testOpenInvalidURLIsInvalidArgument: URLs the driver refuses match
// driver.ErrInvalidArgument, never driver.ErrUnavailable.
func testOpenInvalidURLIsInvalidArgument(t *testing.T, s *store) {
	base := s.url() // dynamodb://TABLE?region=us-east-1&endpoint=http://127.0.0.1:port
	urls := []string{
		"dynamodb://",
		"dynamodb:///dlock_locks",
		"dynamodb://ab?region=us-east-1",
		"dynamodb://bad%21name?region=us-east-1",
		"dynamodb://" + strings.Repeat("t", 256) + "?region=us-east-1",
		"dynamodb://user:pw@" + s.table + "?region=us-east-1",
		"dynamodb://" + s.table + "/extra?region=us-east-1",
		"dynamodb://" + s.table + ":8000?region=us-east-1",
		base + "&nope=1",
		base + "&region=eu-west-1", // twice
		strings.Replace(base, "region=us-east-1", "region=", 1),
		strings.Replace(base, "endpoint=http://", "endpoint=ftp://", 1),
		strings.Replace(base, s.dl.Addr(), "127.0.0.1:99999", 1),
		strings.Replace(base, s.dl.Addr(), "127.0.0.1:", 1),
		base + "&create_table=maybe",
		base + "&gc_after=30m",
		base + "&gc_after=-1h",
		base + "&gc_after=soon",
		s.dl.URL(s.table + "_nosuch"),
		"dynamodbx://" + s.table,
	}
	dlocktest.OpenRefuses(t, dynamodbdriver.Open, urls...)
	dlocktest.RootOpenNotUnavailable(t, urls...)

	// No region in the URL or the environment.
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	noRegion := "dynamodb://" + s.table + "?endpoint=" + s.dl.Endpoint()
	errs := dlocktest.OpenRefuses(t, dynamodbdriver.Open, noRegion)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "region") {
		t.Errorf("Open without a region = %v; want an error naming the region", errs[0])
	}
}

// testOpenByURL: dlock.Open finds the driver by its scheme; the region may
// come from the environment.
func testOpenByURL(t *testing.T, s *store) {
	l, err := dlock.Open(t.Context(), s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ls, err := l.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if ls.Fence() == 0 {
		t.Fatal("fence 0")
	}
	if err := ls.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_REGION", testservers.DynaliteRegion)
	d, err := dynamodbdriver.Open(t.Context(), "dynamodb://"+s.table+"?endpoint="+s.dl.Endpoint())
	if err != nil {
		t.Fatalf("Open with the region from AWS_REGION: %v", err)
	}
	d.Close()
}

// TestOpen_UnreachableIsUnavailable: an endpoint nobody listens on is an
// outage: ErrUnavailable, promptly.
func TestOpen_UnreachableIsUnavailable(t *testing.T) {
	u := fmt.Sprintf("dynamodb://dlock_locks?region=us-east-1&endpoint=http://127.0.0.1:%d", testservers.FreePort(t))
	began := time.Now()
	_, err := dlock.Open(t.Context(), u)
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("dlock.Open with no server = %v, want ErrUnavailable", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("took %v to report the outage", took)
	}
}

// TestOpen_NotDynamoDBIsInvalid: an endpoint that answers, but not as
// DynamoDB (a web server, a JSON API, a Redis-like TCP server, plain HTTP
// behind an https:// endpoint), is a configuration error, not an outage:
// --fail-open must not run a job unlocked because of a wrong URL.
func TestOpen_NotDynamoDBIsInvalid(t *testing.T) {
	web := httptest.NewServer(http.NotFoundHandler())
	defer web.Close()
	jsonAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"hello": 1}`))
	}))
	defer jsonAPI.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // as Redis does: an error for the request, the connection kept
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					// The whole request first (until it pauses), so that
					// the client meets the reply, not a write error.
					_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
					if _, err := c.Read(buf); err != nil {
						return
					}
					for {
						_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
						if _, err := c.Read(buf); err != nil {
							break
						}
					}
					_, _ = c.Write([]byte("-ERR unknown command 'POST'\r\n"))
				}
			}()
		}
	}()
	var urls []string
	for _, e := range []string{web.URL, jsonAPI.URL, "http://" + ln.Addr().String(), "https://" + ln.Addr().String(), "https://" + web.Listener.Addr().String()} {
		urls = append(urls, "dynamodb://dlock_locks?region=us-east-1&endpoint="+e)
	}
	errs := dlocktest.OpenRefuses(t, dynamodbdriver.Open, urls...)
	dlocktest.RootOpenNotUnavailable(t, urls...)
	for i, err := range errs {
		if err != nil && !strings.Contains(err.Error(), "does not answer as DynamoDB") {
			t.Errorf("Open(%s) = %v; want it to say the endpoint is not DynamoDB", urls[i], err)
		}
	}
}

// testOpenNoCredentialsIsPermissionDenied: with no credentials anywhere in
// the SDK's chain (and instance metadata off), Open says so, as a refusal
// (ErrPermissionDenied), not an outage.
func testOpenNoCredentialsIsPermissionDenied(t *testing.T, s *store) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	_, err := dynamodbdriver.Open(t.Context(), s.url())
	if !errors.Is(err, driver.ErrPermissionDenied) || errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "no usable AWS credentials") {
		t.Fatalf("Open without credentials = %v; want ErrPermissionDenied naming the credentials", err)
	}
}
