// Package dynamodbdriver is the dlock driver for Amazon DynamoDB: one item
// per key, written by conditional writes, with expiry decided without any
// shared clock by the record-version scheme of Amazon's DynamoDB lock client
// (github.com/awslabs/amazon-dynamodb-lock-client).
//
//	locker, err := dlock.Open(ctx, "dynamodb://locks?region=eu-west-1")
//
// or, with a client you already have (the driver never closes it):
//
//	d, err := dynamodbdriver.New(dynamodb.NewFromConfig(cfg), "locks", nil)
//	locker := dlock.New(d)
//
// # URL
//
//	dynamodb://TABLE?region=REGION&endpoint=URL&profile=NAME&create_table=true&gc_after=DURATION
//
// where TABLE is required and every parameter optional:
//
//   - TABLE: the lock table's name (3 to 255 of A-Z a-z 0-9 _ . -).
//   - region: the AWS region. Absent: the SDK's (AWS_REGION, the
//     profile's region); an error when neither names one.
//   - endpoint: the service endpoint, http(s)://host[:port], for DynamoDB
//     Local, dynalite or a VPC endpoint. Absent: the region's endpoint.
//   - profile: the shared-config profile (~/.aws/config) to load.
//   - create_table: true makes Open create the table (Migrate) when it is
//     missing; otherwise a missing table is an error that says how to
//     create it.
//   - gc_after: see Options.GCAfter; at least 1h.
//
// # Credentials
//
// Credentials come from the AWS SDK for Go v2's default chain, never from
// the URL: the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN), the shared credentials and config files (with
// profile=, or AWS_PROFILE; SSO and assume-role profiles included), web
// identity (EKS service accounts), the ECS container endpoint, and EC2
// instance metadata. The driver needs dynamodb:GetItem, UpdateItem and
// DescribeTable on the table; Scan for List; CreateTable and
// UpdateTimeToLive for Migrate. A chain that finds no credentials, and
// credentials DynamoDB refuses, are driver.ErrPermissionDenied (never an
// outage). The tests run against dynalite, an emulator that accepts any
// credentials: they set a fixed dummy key in the environment and turn
// instance metadata off (testservers.SetDynaliteEnv).
//
// # Layout
//
// One item per lock key, whose partition key "k" (a string) is the lock key
// itself: DynamoDB takes any UTF-8 of up to 2048 bytes in a key, so keys
// need no escaping. A held item has owner (the grant's owner token), rvn
// (its record version), fence, fence_cap, lease_ns (the holder's TTL),
// holder, and renewed_ms (the holder's wall clock at its last write, for
// display only). A free item keeps k, rvn, fence and fence_cap, and gc_at
// when Options.GCAfter is set. One more item, whose key is longer than any
// lock key can be, counts fence epochs (below).
//
// # How it works
//
// Every write is one conditional UpdateItem, and every write stores a new
// random record version (128 bits). DynamoDB's condition expressions cannot
// read a server clock, so nothing on the store expires by itself, and the
// driver never compares its wall clock with another machine's (the skew
// bug of lock tables that store an expiry time). Instead, as in Amazon's
// lock client:
//
//   - A grant of a free key is a write conditioned on the item being free
//     (or missing), which sets owner, a new record version and the lease,
//     and ADDs 1 to the fence in the same write.
//   - A renewal is a write conditioned on owner = the grant's owner token
//     that stores a new record version. A refused condition is
//     driver.ErrLeaseLost: owner tokens are unique per grant, so an item
//     that does not name the token now never will again. A renewal whose
//     reply was lost (a timeout: the write may or may not have landed) is
//     a store error, not a loss: the next renewal is conditioned on the
//     owner again, not on the version it could not learn, so it succeeds
//     while the item still names the grant.
//   - A key held by another owner is taken over only after this driver has
//     seen the same record version on it for a full lease duration (the
//     lease the holder wrote), measured on this process's monotonic clock
//     from the moment the read that first showed that version returned.
//     The takeover is a write conditioned on that record version, so any
//     renewal that landed meanwhile makes it fail. The holder's validity
//     deadline (kept by the root package) is its request's send time + TTL
//     − drift; that send came before the write the waiter read, so the
//     holder stops trusting its lease before the waiter can take over, up
//     to the clock-rate difference the drift allows for.
//   - A release is a write conditioned on owner that marks the item free
//     and keeps its fence.
//
// # Waiting and TryAcquire
//
// The driver has no Waiter: an Acquire polls with the root package's
// backoff. A TryAcquire of a key held by a live holder returns
// driver.ErrNotAcquired at once (one or two round trips). A TryAcquire of a
// key whose holder has died also returns ErrNotAcquired until this same
// Driver has seen the key's record version unchanged for the holder's
// lease: the driver remembers the version it saw and when, so a later
// TryAcquire, or a waiting Acquire (which polls), takes the key over once
// the lease has passed; a single TryAcquire in a fresh process never can.
// One-shot jobs (cron, dlock run without --wait) that must recover a
// crashed run's key by themselves should wait for longer than the TTL
// (dlock run --wait-timeout 2×TTL); otherwise an operator frees the key
// with dlock release --force (driver.ForceReleaser), which is a
// conditional write like the others.
//
// # Fences
//
// fence = E·2^24 + n: n counts the grants of the key's item (ADD 1 in the
// granting write, from 1 to 2^24 − 1, checked in the condition against
// fence_cap), and E is a fence epoch drawn from the table's epoch counter
// (an atomic ADD) when the item is created, and again in the rare grant
// that finds n exhausted. Epochs only grow, so a key's fences keep growing
// even when its item is deleted and created again (by DynamoDB's TTL, see
// Options.GCAfter, or by hand): the new item starts above every fence the
// old one issued. A key's first grant thus costs three requests more than
// later ones (a refused write, a read, the epoch draw). Fences stay below 2^63 (a signed 64-bit column at the resource)
// for 2^39 epochs.
//
// # Capabilities
//
//   - driver.Inspector: Inspect reads the key's item (strongly consistent);
//     List scans the table (a Scan reads every item: mind its cost on large
//     tables). Remaining is an estimate from the holder's wall clock at its
//     last write, shown for operators only and never used to decide
//     anything; a key whose holder died stays listed (with 0 left) until
//     someone takes it over or force-releases it. Waiters is -1.
//   - driver.ForceReleaser: ForceRelease frees the key whoever holds it.
//   - driver.Resumer: the item is the whole grant, so a restarted process
//     resumes it (Locker.Resume) with one write conditioned on its owner
//     token and fence (see Resume).
//   - No Waiter, no Hinter, no Grant.Lost: loss is found by the next renewal
//     or the validity deadline.
//
// # What DynamoDB cannot promise
//
//   - No server clock: expiry is the waiter's observation, not the store's,
//     so a dead holder's key is freed only by a waiter that polls for a
//     full lease (above), never by the store alone; there is no lock-delay.
//   - Waiters are not ordered (no queue): polling with full-jitter backoff.
//   - Safety needs the clock-rate assumption of every lease (drift covers
//     rates differing by up to 1%), and strongly consistent operations,
//     which conditional writes and the driver's reads are. Global tables
//     replicate asynchronously across regions: use a single-region table
//     (conditions are only checked against the local replica).
//   - Fences are strictly increasing per key as long as the epoch item is
//     never deleted or restored from an older backup (a point-in-time
//     restore brings fences back: move to a new table instead).
//
// # Items the driver did not write
//
// A lock item that is not what the driver writes (an attribute of the
// wrong type, such as an owner stored as a number; a number that does not
// fit 64 bits; no record version; a negative fence) is never read as
// absent, granted over or freed: TryAcquire, Inspect, List and
// ForceRelease refuse it with an error matching driver.ErrInvalidArgument
// that names the item and the attribute. So does a fence that cannot
// advance (the table's epoch counter past 2^39 − 1, or not a number: move
// to a new table). Both are permanent faults of the table's data, not
// outages: never driver.ErrUnavailable, so WithFailOpen never runs work
// unlocked because of them, and retrying cannot help until the item is
// repaired or deleted (a deleted item starts a new epoch, above every
// fence its key had).
//
// The SDK's retries are off (one attempt per call, as every dlock driver
// does: the root package retries with backoff), and a call whose context
// ends returns at once while an acquisition write already sent finishes in
// the background, so that its outcome is known to a Release of the same
// owner token.
//
// # Measured guarantees
//
// dlock verify (package verify) runs this driver's store under every fault
// it can take and counts double grants, fence violations and stale writes
// accepted: the dynamodb section of docs/GUARANTEES.md holds the figures,
// measured on dynalite (an emulator of DynamoDB's API), not on the service.
// make verify regenerates them.
package dynamodbdriver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/logging"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/pgcommon"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func init() {
	driver.Register("dynamodb", openURL)
}

// API is what the driver needs from a DynamoDB client: *dynamodb.Client
// implements it.
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	Scan(ctx context.Context, in *dynamodb.ScanInput, optFns ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// MinGCAfter is the shortest Options.GCAfter: long enough that no write
// can still land that was sent before a free item's deletion (the driver
// never sends an item's creation more than a minute after drawing its
// epoch, and DynamoDB refuses a request whose signature is more than 5
// minutes old), with room for releasers' clocks being fast by half an hour.
const MinGCAfter = time.Hour

// Options configure a Driver. A nil *Options is the zero value.
type Options struct {
	// GCAfter, when > 0, lets DynamoDB's TTL delete items that have been
	// free for that long: a release writes gc_at (the releaser's wall
	// clock + GCAfter, in Unix seconds) and every grant removes it, and
	// Migrate enables the table's TTL on gc_at. Fences stay increasing
	// across a deletion (see "Fences"). At least MinGCAfter; zero value:
	// free items are kept (a few hundred bytes each). The URL parameter is
	// gc_after.
	GCAfter time.Duration
}

// Driver is a dlock driver over a DynamoDB table. It implements
// driver.Driver, driver.Inspector, driver.ForceReleaser and
// driver.Resumer, and is safe for concurrent use.
type Driver struct {
	api     API
	table   string
	gcAfter time.Duration

	ownHTTP *http.Transport // created by Open; its idle connections are closed by Close
	where   string          // "in region R [at ENDPOINT]" when opened by URL, for messages

	seen observations

	closed    atomic.Bool
	closeOnce sync.Once

	mu      sync.Mutex
	pending map[string]*attempt // acquisitions in flight, by owner token
	bg      sync.WaitGroup      // their goroutines

	detached pgcommon.Detacher // the acquisitions' contexts, ended by Close
}

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.Inspector     = (*Driver)(nil)
	_ driver.ForceReleaser = (*Driver)(nil)
)

var tableName = regexp.MustCompile(`^[A-Za-z0-9_.-]{3,255}$`)

// CheckTable returns nil when table is a valid DynamoDB table name (3 to
// 255 of A-Z a-z 0-9 _ . -), else an error matching
// driver.ErrInvalidArgument that says why.
func CheckTable(table string) error {
	if !tableName.MatchString(table) {
		return urlparam.Invalid("dynamodbdriver: table name %q is not 3 to 255 of A-Z a-z 0-9 _ . -", table)
	}
	return nil
}

// New returns a driver that keeps its leases in table through api. It does
// no I/O: the table must exist (see Migrate). It returns an error matching
// driver.ErrInvalidArgument for an invalid table name or options.
func New(api API, table string, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if api == nil {
		return nil, urlparam.Invalid("dynamodbdriver: nil client")
	}
	if err := CheckTable(table); err != nil {
		return nil, err
	}
	if o.GCAfter != 0 && o.GCAfter < MinGCAfter {
		return nil, urlparam.Invalid("dynamodbdriver: GCAfter %v is shorter than %v (a free item must stay long enough for every write sent before its deletion to have landed)", o.GCAfter, MinGCAfter)
	}
	return &Driver{
		api:     api,
		table:   table,
		gcAfter: o.GCAfter,
		pending: map[string]*attempt{},
	}, nil
}

// Table returns the lock table's name.
func (d *Driver) Table() string { return d.table }

// Open opens a driver on a dynamodb:// URL (see the package doc), with a
// client of its own built from the SDK's default configuration and
// credential chain; Close closes its connections. It asks DynamoDB for
// the table (DescribeTable) and returns an error wrapping
// driver.ErrUnavailable when the service cannot be reached (or does not
// answer within 10 s), and one matching driver.ErrInvalidArgument for an
// invalid URL, a missing table (unless create_table=true, which creates
// it), a table whose key schema is not the driver's, an endpoint that
// answers but not as DynamoDB (another HTTP service, a non-HTTP server),
// and credentials DynamoDB refuses (driver.ErrPermissionDenied).
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, urlparam.Wrap("dynamodbdriver", err)
	}
	return open(ctx, u)
}

func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) { return open(ctx, u) }

// urlConfig is a parsed dynamodb:// URL.
type urlConfig struct {
	table, region, endpoint, profile string
	create                           bool
	opts                             Options
}

func parseURL(u *url.URL) (urlConfig, error) {
	var c urlConfig
	if u.Scheme != "dynamodb" {
		return c, urlparam.Invalid("dynamodbdriver: URL scheme %q is not dynamodb", u.Scheme)
	}
	if u.User != nil {
		return c, urlparam.Invalid("dynamodbdriver: the URL carries user information; credentials come from the AWS SDK's chain (environment, shared config, instance roles), never from the URL")
	}
	if u.Opaque != "" || u.Host == "" {
		return c, urlparam.Invalid("dynamodbdriver: the URL names no table (want dynamodb://TABLE?region=…)")
	}
	if u.Path != "" && u.Path != "/" {
		return c, urlparam.Invalid("dynamodbdriver: unexpected path %q after the table (want dynamodb://TABLE?region=…)", u.Path)
	}
	c.table = u.Host
	if err := CheckTable(c.table); err != nil {
		return c, err
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return c, urlparam.Wrap("dynamodbdriver", err)
	}
	if err := urlparam.Known("dynamodbdriver", q, "region", "endpoint", "profile", "create_table", "gc_after"); err != nil {
		return c, err
	}
	for name, vals := range q {
		if len(vals) > 1 {
			return c, urlparam.Invalid("dynamodbdriver: URL parameter %s given %d times", name, len(vals))
		}
	}
	c.region, c.profile = q.Get("region"), q.Get("profile")
	if q.Has("region") && c.region == "" {
		return c, urlparam.Invalid("dynamodbdriver: URL parameter region is empty")
	}
	if e := q.Get("endpoint"); e != "" {
		eu, err := url.Parse(e)
		if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" || eu.User != nil ||
			(eu.Path != "" && eu.Path != "/") || eu.RawQuery != "" || eu.Fragment != "" {
			return c, urlparam.Invalid("dynamodbdriver: URL parameter endpoint=%q is not http(s)://host[:port]", e)
		}
		if err := urlparam.Port("dynamodbdriver: endpoint", eu.Host); err != nil {
			return c, err
		}
		c.endpoint = eu.Scheme + "://" + eu.Host
	} else if q.Has("endpoint") {
		return c, urlparam.Invalid("dynamodbdriver: URL parameter endpoint is empty")
	}
	if v := q.Get("create_table"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return c, urlparam.Invalid("dynamodbdriver: URL parameter create_table=%q is not true or false", v)
		}
		c.create = b
	}
	if err := urlparam.Durations(q, map[string]*time.Duration{"gc_after": &c.opts.GCAfter}); err != nil {
		return c, urlparam.Wrap("dynamodbdriver", err)
	}
	if c.opts.GCAfter != 0 && c.opts.GCAfter < MinGCAfter {
		return c, urlparam.Invalid("dynamodbdriver: URL parameter gc_after=%v is shorter than %v (a free item must stay long enough for every write sent before its deletion to have landed)", c.opts.GCAfter, MinGCAfter)
	}
	return c, nil
}

func open(ctx context.Context, u *url.URL) (*Driver, error) {
	c, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	// The SDK's own client, so that the configuration can add what it
	// must (a CA bundle from AWS_CA_BUNDLE or the profile); then the
	// driver's client over a transport it owns, whose connections Close
	// closes.
	hc := awshttp.NewBuildableClient().WithTransportOptions(transportOptions)
	loadOpts := []func(*config.LoadOptions) error{config.WithHTTPClient(hc)}
	if c.region != "" {
		loadOpts = append(loadOpts, config.WithRegion(c.region))
	}
	if c.profile != "" {
		loadOpts = append(loadOpts, config.WithSharedConfigProfile(c.profile))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, urlparam.Wrap("dynamodbdriver: loading the AWS configuration", err)
	}
	if cfg.Region == "" {
		return nil, urlparam.Invalid("dynamodbdriver: no AWS region: add region= to the URL or set AWS_REGION")
	}
	var tr *http.Transport
	if bc, ok := cfg.HTTPClient.(*awshttp.BuildableClient); ok {
		tr = bc.GetTransport()
	} else {
		tr = awshttp.NewBuildableClient().WithTransportOptions(transportOptions).GetTransport()
	}
	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if c.endpoint != "" {
			o.BaseEndpoint = aws.String(c.endpoint)
		}
		o.HTTPClient = &http.Client{Transport: tr}
		// One attempt per call: the root package retries, with backoff
		// and its own budget, and an ambiguous write must surface to it.
		o.Retryer = aws.NopRetryer{}
		// Errors reach the caller; the SDK logs nothing of its own (its
		// default logger writes warnings to stderr).
		o.Logger = logging.Nop{}
	})
	d, err := New(client, c.table, &c.opts)
	if err != nil {
		return nil, err
	}
	d.ownHTTP = tr
	d.where = "in region " + cfg.Region
	if c.endpoint != "" {
		d.where += " at " + c.endpoint
	}
	if err := d.checkTable(ctx, c.create); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// transportOptions set up the HTTP transport of a driver opened by URL:
// bounded dials and TLS handshakes (every request is bounded by its
// context too), and enough idle connections for many concurrent leases.
func transportOptions(tr *http.Transport) {
	tr.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = 5 * time.Second
	tr.MaxIdleConns = 256
	tr.MaxIdleConnsPerHost = 256
	tr.IdleConnTimeout = 90 * time.Second
}

// attempt is an acquisition in flight.
type attempt struct {
	done  chan struct{}
	grant driver.Grant
	err   error
}

// TryAcquire implements driver.Driver: see "How it works" in the package
// doc. It makes at most four requests: a conditional grant (or takeover)
// write, a strongly consistent read when that write was refused, a fence
// epoch draw when the key's item is new, and the write the read called
// for.
//
// When ctx ends while a request is out, TryAcquire returns ctx's error at
// once and the acquisition finishes in the background (given at least 5 s,
// or until ctx's deadline when later). Until it has, the owner token is
// pending: a Release for it waits for the outcome first, so the root
// package's clean-up never misses a grant that raced the cancellation.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("dynamodbdriver: acquire: %w", err)
	}
	a := &attempt{done: make(chan struct{})}
	d.mu.Lock()
	if d.closed.Load() { // under d.mu: no bg.Add once Close waits
		d.mu.Unlock()
		return driver.Grant{}, driver.ErrClosed
	}
	d.pending[req.Owner] = a
	d.bg.Add(1)
	d.mu.Unlock()
	qctx, cancel := d.detached.Detach(ctx)
	go func() {
		defer d.bg.Done()
		defer cancel()
		a.grant, a.err = d.tryAcquire(qctx, req)
		d.mu.Lock()
		delete(d.pending, req.Owner)
		d.mu.Unlock()
		close(a.done)
	}()
	select {
	case <-a.done:
		return a.grant, a.err
	case <-ctx.Done():
		return driver.Grant{}, ctx.Err()
	}
}

// awaitPending waits until no acquisition by owner is in flight.
func (d *Driver) awaitPending(ctx context.Context, owner string) error {
	d.mu.Lock()
	a := d.pending[owner]
	d.mu.Unlock()
	if a == nil {
		return nil
	}
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Renew implements driver.Driver: a write conditioned on owner that stores
// a new record version and the lease ttl. A refused condition is
// driver.ErrLeaseLost; see "How it works" for a renewal whose reply was
// lost.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("dynamodbdriver: renew: %w", err)
	}
	if d.closed.Load() {
		return driver.ErrClosed
	}
	_, err := d.api.UpdateItem(ctx, d.renewInput(key, owner, ttl))
	if isConditionFailed(err) {
		return driver.ErrLeaseLost
	}
	if err != nil {
		return storeErr("renew", err)
	}
	return nil
}

// Release implements driver.Driver: a write conditioned on owner that marks
// the item free, keeping its fence (and, with Options.GCAfter, setting
// gc_at). A refused condition is driver.ErrLeaseLost and changes nothing.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("dynamodbdriver: release: %w", err)
	}
	if d.closed.Load() {
		return driver.ErrClosed
	}
	if err := d.awaitPending(ctx, owner); err != nil {
		return err
	}
	_, err := d.api.UpdateItem(ctx, d.releaseInput(key, condOwner(owner)))
	if isConditionFailed(err) {
		return driver.ErrLeaseLost
	}
	if err != nil {
		return storeErr("release", err)
	}
	return nil
}

// closeGrace is how long Close lets acquisitions still finishing in the
// background run before it cancels them.
const closeGrace = 100 * time.Millisecond

// Close gives acquisitions still finishing in the background 100 ms
// before it cancels them, and closes the idle connections of a driver
// opened by URL; a client given to New is left alone. Grants stay on the
// table: another client takes them over after their lease. Closing twice
// returns nil.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closed.Store(true)
		d.mu.Unlock()
		if !pgcommon.WaitGrace(&d.bg, closeGrace) {
			d.detached.Abort()
			d.bg.Wait()
		}
		if d.ownHTTP != nil {
			d.ownHTTP.CloseIdleConnections()
		}
	})
	return nil
}

// newRVN returns a new record version: 128 random bits, hex.
func newRVN() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("dynamodbdriver: crypto/rand: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}
