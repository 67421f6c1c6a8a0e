// Package azblobdriver is the dlock driver for Azure Blob Storage leases:
// one blob per key, the grant is a blob lease, and the Blob service owns
// expiry.
//
//	import _ "github.com/dlock-dev/dlock/drivers/azblobdriver"
//
//	locker, err := dlock.Open(ctx, "azblob://myaccount/locks")
//
// or, with a container client you already have (the driver never closes
// its transport):
//
//	d, err := azblobdriver.New(containerClient, nil)
//	locker := dlock.New(d)
//
// # URL
//
//	azblob://ACCOUNT/CONTAINER?endpoint=URL&auth=default|sharedkey|emulator&create_container=true|false
//
// The parts of the URL:
//
//   - ACCOUNT: the storage account name (3 to 24 lowercase letters and
//     digits).
//   - CONTAINER: the container that holds the lock blobs (3 to 63
//     lowercase letters, digits and single hyphens). Give dlock a container
//     of its own: other blobs in it are ignored but never touched, and a
//     lock blob must never be deleted (see "Safety assumptions").
//   - endpoint: the Blob service URL. Default
//     https://ACCOUNT.blob.core.windows.net. For the Azurite emulator,
//     http://127.0.0.1:10000/devstoreaccount1 (path-style: the account is
//     the first path segment).
//   - auth: how requests are authorised. default (the default):
//     azidentity.DefaultAzureCredential, the SDK's standard chain
//     (environment variables AZURE_TENANT_ID/AZURE_CLIENT_ID/…, workload
//     identity, managed identity, Azure CLI, Azure Developer CLI); it needs
//     an https endpoint and a role such as Storage Blob Data Contributor on
//     the container. sharedkey: the account key read from the environment
//     variable AZURE_STORAGE_KEY (never from the URL, so that it cannot
//     leak into logs). emulator: the well-known key of the emulator's
//     development account devstoreaccount1, which Microsoft publishes in
//     Azurite's documentation (only with ACCOUNT devstoreaccount1).
//   - create_container: create the container when it is missing (Open,
//     and the first acquisition that finds it gone). Default true; false
//     when the identity may not create containers.
//
// Open checks the container (and creates it when allowed): it returns an
// error matching driver.ErrUnavailable when the service cannot be reached,
// driver.ErrPermissionDenied when it refuses the credentials, and
// driver.ErrInvalidArgument for a bad URL.
//
// # How it works
//
// Each key is a block blob named by the key's bytes in lowercase hex (so
// that any key up to driver.MaxKeyBytes fits Azure's 1,024-character blob
// names, and List's prefix and order are the keys'). The blob is empty; its
// metadata holds the fence counter (dlockfence), the grant's TTL (dlockttl)
// and the holder description (dlockholder, percent-encoded).
//
// The lease ID of a grant is derived from its owner token (a UUID made of
// the first 128 bits of SHA-256 of the token), so Renew and Release need
// no state in the client and the token itself never leaves the process.
//
// An acquisition is one attempt of up to three requests (four on a key's
// first use):
//
//  1. Get Blob Properties reads the lease state, the fence counter F and
//     the ETag E. A leased (or breaking) blob is ErrNotAcquired at once,
//     without a write. A missing blob is created empty with fence 0 under
//     If-None-Match: * (a racing creator makes this attempt re-read).
//  2. Lease Blob (acquire) with the owner's lease ID and the service lease
//     duration (below), conditioned on If-Match: E. A lease held by another
//     ID, or an ETag that moved (another grant came first), is
//     ErrNotAcquired.
//  3. Set Blob Metadata writes fence F+1, conditioned on the lease ID and
//     If-Match on the ETag the lease operation returned. Every grant's
//     metadata write changes the ETag, and while the lease is held only its
//     holder can write the blob, so the chain of conditions from the read
//     in step 1 to this write admits no other grant in between: fences of a
//     key increase strictly, in grant order. A refusal (the lease was
//     broken, or expired and taken, meanwhile) is ErrNotAcquired.
//
// The fence is the grant's metadata counter, not a service-wide sequence:
// strictly increasing per key, which is what the contract asks.
//
// Renew is Lease Blob (renew) with the lease ID; Release reads the lease
// state (a lease already broken or expired is ErrLeaseLost and is left
// alone) and then releases by lease ID. A refusal by the service
// (LeaseIdMismatchWithLeaseOperation, LeaseNotPresentWithLeaseOperation,
// LeaseIsBrokenAndCannotBeRenewed, a missing blob) is ErrLeaseLost, and
// so is an answer that the lease is being broken
// (LeaseIsBreakingAndCannotBeChanged, LeaseIsBreakingAndCannotBeAcquired:
// a force release with a break period is under way, and the holder's
// grant ends with it; another owner's TryAcquire of a breaking lease is
// ErrNotAcquired); any other failure is a store error, which the root package retries until the
// lease's validity deadline. A renewal whose reply was lost is therefore
// never taken for a loss: the next renewal asks the service again, and the
// service answers by lease ID, which still names the holder while its lease
// lasts. The blob and its counter stay after a release.
//
// ForceRelease (dlock release --force) reads the lease state, the grant's
// metadata and the ETag, and breaks the lease with a break period of 0
// conditioned on If-Match on that ETag, so it removes only the grant it
// read and reports: a grant made since the read (every grant writes the
// metadata, which moves the ETag) is left alone, and the call returns an
// error saying that the key changed (a plain error, like the other
// drivers' force releases: running it again reads and breaks the new
// grant). The next grant gets a greater fence, so a holder that was still
// alive is fenced out. Azure keeps no log of the reason.
//
// The algorithm is Azure's lease semantics as documented for Lease Blob
// (https://learn.microsoft.com/rest/api/storageservices/lease-blob) with
// the conditional-request headers of
// https://learn.microsoft.com/rest/api/storageservices/specifying-conditional-headers-for-blob-service-operations.
//
// # TTLs and the service lease
//
// A blob lease lasts 15 to 60 whole seconds (or forever, which is never
// used: nothing would then expire a dead holder's grant). The driver leases
// for the TTL rounded up to whole seconds and at least 15 s (ServiceLease),
// and refuses a TTL above 60 s with driver.ErrInvalidTTL.
//
// This mapping is safe because the service lease is never shorter than the
// TTL: the root package deems a lease valid until sent + TTL − drift on the
// client's monotonic clock, where sent precedes the service's start of the
// lease, so the client stops trusting its grant no later than the service
// ends it. A TTL below 15 s therefore keeps its fast self-fencing (the
// client gives up after the TTL) but not its fast takeover: after a holder
// dies without releasing, the key stays held for the service lease (up to
// 15 s), not the TTL. A TTL above 60 s cannot be mapped safely: a 60 s
// service lease renewed by the heartbeat would let a holder whose renewals
// stopped believe in its lease for up to the TTL while the service had
// expired it after 60 s, so it is refused. Renew must be given the TTL of
// the grant (the root package always does): the service keeps the duration
// set at acquisition.
//
// # Capabilities
//
//   - driver.Inspector: Inspect and List read the lease state and the
//     metadata. Remaining is always 0: the service does not tell how long
//     a lease has left. Waiters is -1 (polling waiters are not recorded).
//   - driver.ForceReleaser: ForceRelease breaks the lease it read (see
//     "How it works").
//   - driver.Resumer: the lease ID derives from the owner token, so a
//     restarted process resumes its grant (Locker.Resume): the fence and
//     lease state read, then a renewal by lease ID under If-Match (see
//     Resume).
//   - No driver.Waiter and no hints: waiting is the root package's
//     full-jitter backoff polling (each poll of a held key is one read).
//   - Grant.Lost is not set: the service cannot push loss; the root
//     package relies on renewals and the validity deadline.
//
// # Safety assumptions
//
//   - The service's clock rate decides expiry; the client's wall clock is
//     never compared with it.
//   - A lock blob is never deleted, and its metadata never written by
//     anything but this driver. The driver cannot promise fences across a
//     deletion: the acquisition path recreates a missing blob (and, with
//     create_container, the default, a missing container) without being
//     able to tell it from a key's first use, so after a blob or the
//     container is deleted the key's fences restart at 1 and repeat
//     fences issued before. Azure offers no service-wide sequence to draw
//     fences from that would survive it. Keep lifecycle rules and
//     operators away from the container, and open with
//     create_container=false where the container is made by hand, so that
//     a deleted container fails acquisitions (driver.ErrInvalidArgument)
//     instead of being recreated silently.
//   - A lock blob whose fence counter (dlockfence) does not parse, or
//     cannot advance (2^64 − 1), is a permanent fault of the blob, not an
//     outage: TryAcquire of its key fails with an error matching
//     driver.ErrInvalidArgument that names the blob and what is wrong
//     (never driver.ErrUnavailable, so WithFailOpen never runs work
//     unlocked because of it), and leaves the blob as it is.
//   - An inspection of a key whose grant is half-way (the lease acquired,
//     its metadata not yet written, or never written because the attempt
//     failed) shows the previous grant's fence and holder.
//   - Release and ForceRelease read the lease state before they write. A
//     force release that lands between a holder's read and its release
//     lets that release succeed on the broken lease (the service accepts a
//     release by the broken lease's ID); nothing else held the key then.
//     A force release whose read saw grant G and whose break lands while
//     the next grant is half-way (its lease acquired after G ended, its
//     metadata not yet written, so the ETag has not moved) breaks that
//     lease and reports G: the half-way grant then fails its metadata
//     write and is never granted (its TryAcquire is ErrNotAcquired), so no
//     granted holder loses its lease to a break meant for another.
//
// # The Azurite emulator
//
// The tests run against Azurite 3.37.0's blob service. It enforces the
// 15–60 s lease durations, lease IDs, ETag conditions and lease breaking
// like the service, with two differences the driver does not rely on: it
// does not check the lease ID of a renewal of an expired lease (the
// service does), and it keeps its metadata in memory and saves it every
// 5 s, so a crash of the emulator (not a graceful stop) can lose recent
// fences. Figures measured against it say nothing about the service's
// latency.
//
// # Measured guarantees
//
// dlock verify (package verify) runs this driver's store under every fault
// it can take and counts double grants, fence violations and stale writes
// accepted. A blob lease lasts at least 15 s, so its runs are 15 times as
// long as the other stores' and it is not in the default matrix (make
// verify): dlock verify matrix --stores azblob runs its column (about 15
// minutes), on Azurite, the Azure Storage emulator, not on the service.
// Azurite forgets its leases when it restarts and saves its metadata every 5
// s, so its kill cells fail on the emulator.
package azblobdriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func init() {
	driver.Register("azblob", openURL)
}

// Limits of Azure blob leases, and so of this driver's TTLs.
const (
	// MinServiceLease is the shortest lease the Blob service grants; a
	// shorter TTL is served by a lease of this length (see ServiceLease).
	MinServiceLease = 15 * time.Second
	// MaxTTL is the longest TTL the driver accepts: the longest finite
	// lease the Blob service grants. A longer TTL is driver.ErrInvalidTTL.
	MaxTTL = 60 * time.Second
)

// Metadata names on a lock blob (Azure returns them case-insensitively).
const (
	metaFence  = "dlockfence"
	metaTTL    = "dlockttl"
	metaHolder = "dlockholder"
)

// Options configure a Driver. A nil *Options is the zero value.
type Options struct {
	// NoCreateContainer makes TryAcquire report a missing container as an
	// error instead of creating it. Zero value: create it when missing.
	NoCreateContainer bool
}

// Driver is a dlock driver over Azure blob leases. It implements
// driver.Driver, driver.Inspector, driver.ForceReleaser and
// driver.Resumer, and is safe for concurrent use.
type Driver struct {
	c               *container.Client
	createContainer bool
	transport       *http.Transport // created by Open; idle connections closed by Close

	closing   context.Context // cancelled by Close: ends calls in flight
	close     context.CancelFunc
	aborting  context.Context // cancelled by Close after closeGrace: ends attempts finishing in the background
	abort     context.CancelFunc
	closed    atomic.Bool
	closeOnce sync.Once

	mu      sync.Mutex
	pending map[string]*attempt // acquisitions in flight, by owner token
	bg      sync.WaitGroup      // their goroutines
}

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.Inspector     = (*Driver)(nil)
	_ driver.ForceReleaser = (*Driver)(nil)
)

// New returns a driver that keeps its leases in the container of c. It
// does no I/O. Close does not close c's transport. c must not retry on its
// own (azcore's policy.RetryOptions.MaxRetries -1): the root package
// retries with backoff, and a client-side retry of an acquisition could
// outlast the caller's op timeout.
func New(c *container.Client, opts *Options) (*Driver, error) {
	if c == nil {
		return nil, fmt.Errorf("azblobdriver: %w: nil container client", driver.ErrInvalidArgument)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	d := &Driver{c: c, createContainer: !o.NoCreateContainer, pending: map[string]*attempt{}}
	d.closing, d.close = context.WithCancel(context.Background())
	d.aborting, d.abort = context.WithCancel(context.Background())
	return d, nil
}

// ServiceLease returns the length of the blob lease that serves a grant
// with the given TTL: the TTL rounded up to whole seconds, at least
// MinServiceLease. It is also how long a key stays held after its holder
// died without releasing it. A TTL outside [driver.MinTTL, MaxTTL] is an
// error matching driver.ErrInvalidTTL.
func ServiceLease(ttl time.Duration) (time.Duration, error) {
	s, err := leaseSeconds(ttl)
	return time.Duration(s) * time.Second, err
}

func leaseSeconds(ttl time.Duration) (int32, error) {
	if err := driver.CheckTTL(ttl); err != nil {
		return 0, err
	}
	if ttl > MaxTTL {
		return 0, fmt.Errorf("%w: %v is longer than %v, the longest Azure blob lease (a shorter service lease renewed by the heartbeat could expire while the client still trusted its TTL)",
			driver.ErrInvalidTTL, ttl, MaxTTL)
	}
	s := int32((ttl + time.Second - 1) / time.Second)
	return max(s, int32(MinServiceLease/time.Second)), nil
}

// blobName is the key's bytes in lowercase hex: at most 1,024 characters,
// prefix- and order-preserving.
func blobName(key string) string { return hex.EncodeToString([]byte(key)) }

// keyOf decodes a blob name, or reports false for a blob that is not a
// lock blob.
func keyOf(name string) (string, bool) {
	if name == "" || len(name)%2 != 0 || strings.ToLower(name) != name {
		return "", false
	}
	b, err := hex.DecodeString(name)
	if err != nil || driver.CheckKey(string(b)) != nil {
		return "", false
	}
	return string(b), true
}

// LeaseID returns the blob lease ID that the driver uses for a grant to
// owner: a UUID (version 8, RFC 9562) made of the first 128 bits of
// SHA-256 of the owner token. Deriving it keeps the driver stateless (Renew
// and Release compute it again) and keeps the token itself on the client.
func LeaseID(owner string) string {
	h := sha256.Sum256([]byte("dlock azblob lease id\x00" + owner))
	b := h[:16]
	b[6] = b[6]&0x0f | 0x80 // version 8: custom
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// opCtx returns ctx, also cancelled when the driver closes.
func (d *Driver) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.closing, cancel)
	return ctx, func() { stop(); cancel() }
}

// detachMin is the least time an acquisition attempt is given to finish in
// the background after its caller's context ended.
const detachMin = 5 * time.Second

// closeGrace is how long Close lets acquisition attempts finish before it
// interrupts them.
const closeGrace = 100 * time.Millisecond

// attempt is an acquisition in flight.
type attempt struct {
	done  chan struct{}
	grant driver.Grant
	err   error
}

// TryAcquire implements driver.Driver (see "How it works").
//
// The attempt's requests are never abandoned half-way: an HTTP request
// whose caller gave up may still be carried out by the service, too late
// for the caller's clean-up Release to see it. So when ctx ends first,
// TryAcquire returns ctx's error at once and the attempt finishes in the
// background (given at least 5 s, or until ctx's deadline when later, and
// interrupted by Close after 100 ms). Until it has, the owner token is
// pending: a Release for it waits for the outcome first, so the clean-up
// never misses a grant.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("azblobdriver: acquire: %w", err)
	}
	secs, err := leaseSeconds(req.TTL)
	if err != nil {
		return driver.Grant{}, fmt.Errorf("azblobdriver: acquire: %w", err)
	}
	if d.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	a := &attempt{done: make(chan struct{})}
	d.mu.Lock()
	d.pending[req.Owner] = a
	d.bg.Add(1)
	d.mu.Unlock()
	deadline := time.Now().Add(detachMin)
	if dl, ok := ctx.Deadline(); ok && dl.After(deadline) {
		deadline = dl
	}
	actx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	stop := context.AfterFunc(d.aborting, cancel)
	go func() {
		defer d.bg.Done()
		defer cancel()
		defer stop()
		a.grant, a.err = d.tryAcquire(actx, req, secs)
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
	case <-d.closing.Done():
		return driver.Grant{}, driver.ErrClosed
	}
}

func (d *Driver) tryAcquire(ctx context.Context, req driver.AcquireRequest, secs int32) (driver.Grant, error) {
	name := blobName(req.Key)
	bc := d.c.NewBlobClient(name)
	fence, etag, err := d.readForGrant(ctx, name)
	if err != nil {
		return driver.Grant{}, err
	}
	lc, err := lease.NewBlobClient(bc, &lease.BlobClientOptions{LeaseID: to.Ptr(LeaseID(req.Owner))})
	if err != nil {
		return driver.Grant{}, fmt.Errorf("azblobdriver: acquire: %w", err)
	}
	acq, err := lc.AcquireLease(ctx, secs, &lease.BlobAcquireOptions{
		ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &etag},
	})
	if err != nil {
		if bloberror.HasCode(err, bloberror.LeaseAlreadyPresent, bloberror.LeaseIsBreakingAndCannotBeAcquired, bloberror.ConditionNotMet) {
			return driver.Grant{}, driver.ErrNotAcquired
		}
		return driver.Grant{}, storeErr("acquire", err)
	}
	if acq.ETag != nil {
		etag = *acq.ETag
	}
	next := fence + 1
	md := map[string]*string{
		metaFence: to.Ptr(strconv.FormatUint(next, 10)),
		metaTTL:   to.Ptr(req.TTL.String()),
	}
	if req.Holder != "" {
		md[metaHolder] = to.Ptr(url.PathEscape(req.Holder))
	}
	_, err = bc.SetMetadata(ctx, md, &blob.SetMetadataOptions{AccessConditions: &blob.AccessConditions{
		LeaseAccessConditions:    &blob.LeaseAccessConditions{LeaseID: to.Ptr(LeaseID(req.Owner))},
		ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &etag},
	}})
	if err != nil {
		if bloberror.HasCode(err, bloberror.ConditionNotMet, bloberror.LeaseLost, bloberror.LeaseIDMismatchWithBlobOperation,
			bloberror.LeaseNotPresentWithBlobOperation, bloberror.LeaseIDMissing,
			bloberror.LeaseIsBreakingAndCannotBeAcquired, bloberror.LeaseIsBreakingAndCannotBeChanged) {
			// The lease was broken, or is being broken (or expired and
			// was taken), between the acquire and this write: no grant.
			return driver.Grant{}, driver.ErrNotAcquired
		}
		// Ambiguous: the write may have happened. The root package
		// releases the owner's lease; the fence it may have used is
		// skipped, never reused.
		return driver.Grant{}, storeErr("acquire", err)
	}
	return driver.Grant{Fence: next}, nil
}

// readForGrant reads the fence counter and ETag of a free key's blob,
// creating the blob (and the container, when allowed) on first use. A held
// key is ErrNotAcquired.
func (d *Driver) readForGrant(ctx context.Context, name string) (uint64, azcore.ETag, error) {
	bc := d.c.NewBlobClient(name)
	for try := 0; ; try++ {
		props, err := bc.GetProperties(ctx, nil)
		switch {
		case err == nil:
			if held(props.LeaseState) {
				return 0, "", driver.ErrNotAcquired
			}
			if props.ETag == nil {
				return 0, "", fmt.Errorf("azblobdriver: acquire: the service returned no ETag for blob %s", name)
			}
			fence, err := fenceOf(props.Metadata)
			if err != nil {
				return 0, "", corrupt(name, err.Error())
			}
			if fence == math.MaxUint64 {
				return 0, "", corrupt(name, fmt.Sprintf("its fence counter %d cannot advance (no greater 64-bit fence exists)", fence))
			}
			return fence, *props.ETag, nil
		case try > 0 || !bloberror.HasCode(err, bloberror.BlobNotFound, bloberror.ContainerNotFound):
			return 0, "", storeErr("acquire", err)
		}
		if bloberror.HasCode(err, bloberror.ContainerNotFound) {
			if err := d.ensureContainer(ctx); err != nil {
				return 0, "", err
			}
		}
		etag, err := d.createBlob(ctx, name)
		if err == nil {
			return 0, etag, nil
		}
		if !bloberror.HasCode(err, bloberror.BlobAlreadyExists, bloberror.ConditionNotMet, bloberror.LeaseIDMissing) {
			return 0, "", storeErr("acquire", err)
		}
		// Another client created it first: read it (once).
	}
}

// corrupt is the error of a lock blob whose metadata the driver cannot use
// (a fence counter that does not parse or cannot advance): a permanent
// fault of the blob, not an outage, so it matches
// driver.ErrInvalidArgument (retrying cannot help; WithFailOpen never runs
// work because of it), never driver.ErrUnavailable.
func corrupt(name, why string) error {
	return urlparam.Invalid("azblobdriver: acquire: blob %s: %s: a permanent fault of the blob's metadata, not an outage (repair it)", name, why)
}

// createBlob creates an empty lock blob with fence 0, only if none exists.
func (d *Driver) createBlob(ctx context.Context, name string) (azcore.ETag, error) {
	resp, err := d.c.NewBlockBlobClient(name).Upload(ctx, streaming.NopCloser(strings.NewReader("")), &blockblob.UploadOptions{
		Metadata: map[string]*string{metaFence: to.Ptr("0")},
		AccessConditions: &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{
			IfNoneMatch: to.Ptr(azcore.ETagAny),
		}},
	})
	if err != nil {
		return "", err
	}
	if resp.ETag == nil {
		return "", fmt.Errorf("azblobdriver: acquire: the service returned no ETag for new blob %s", name)
	}
	return *resp.ETag, nil
}

// ensureContainer creates the container when allowed; one that exists
// already is fine.
func (d *Driver) ensureContainer(ctx context.Context) error {
	if !d.createContainer {
		return fmt.Errorf("azblobdriver: container %s does not exist (create it, or allow create_container): %w",
			d.c.URL(), driver.ErrInvalidArgument)
	}
	_, err := d.c.Create(ctx, nil)
	if err != nil && !bloberror.HasCode(err, bloberror.ContainerAlreadyExists, bloberror.ContainerBeingDeleted) {
		return storeErr("create container", err)
	}
	return nil
}

// held reports whether a lease state means the key is held: leased, or
// breaking (a break period that has not run out yet).
func held(s *lease.StateType) bool {
	return s != nil && (*s == lease.StateTypeLeased || *s == lease.StateTypeBreaking)
}

// meta returns the metadata value of name, matched case-insensitively
// (Azure returns names in the HTTP header's canonical case).
func meta(md map[string]*string, name string) (string, bool) {
	for k, v := range md {
		if strings.EqualFold(k, name) && v != nil {
			return *v, true
		}
	}
	return "", false
}

func fenceOf(md map[string]*string) (uint64, error) {
	v, ok := meta(md, metaFence)
	if !ok {
		return 0, nil // a blob created by someone else: count from 0
	}
	f, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("metadata %s=%q is not a fence counter", metaFence, v)
	}
	return f, nil
}

// lostCodes are the service's answers that say a lease ID does not hold
// the blob's lease, or holds it only until a break under way ends it: a
// lease that is breaking (LeaseIsBreakingAndCannotBeAcquired,
// LeaseIsBreakingAndCannotBeChanged) is being force-released, so for its
// holder it is lost, never an outage.
var lostCodes = []bloberror.Code{
	bloberror.LeaseIDMismatchWithLeaseOperation, bloberror.LeaseNotPresentWithLeaseOperation,
	bloberror.LeaseIsBrokenAndCannotBeRenewed, bloberror.LeaseAlreadyBroken, bloberror.BlobNotFound,
	bloberror.ContainerNotFound,
	bloberror.LeaseIsBreakingAndCannotBeAcquired, bloberror.LeaseIsBreakingAndCannotBeChanged,
}

// Renew implements driver.Driver: Lease Blob (renew) with the owner's lease
// ID, which restarts the service lease at the duration set at acquisition
// (ttl must be the grant's TTL).
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("azblobdriver: renew: %w", err)
	}
	if _, err := leaseSeconds(ttl); err != nil {
		return fmt.Errorf("azblobdriver: renew: %w", err)
	}
	if d.closed.Load() {
		return driver.ErrClosed
	}
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	lc, err := lease.NewBlobClient(d.c.NewBlobClient(blobName(key)), &lease.BlobClientOptions{LeaseID: to.Ptr(LeaseID(owner))})
	if err != nil {
		return fmt.Errorf("azblobdriver: renew: %w", err)
	}
	if _, err := lc.RenewLease(ctx, nil); err != nil {
		if bloberror.HasCode(err, lostCodes...) {
			return driver.ErrLeaseLost
		}
		return storeErr("renew", err)
	}
	return nil
}

// Release implements driver.Driver: it reads the lease state, and releases
// the lease by the owner's lease ID only when it is leased. A lease that is
// broken, expired or absent, or held by another ID, is ErrLeaseLost.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("azblobdriver: release: %w", err)
	}
	if err := d.awaitPending(ctx, owner); err != nil {
		return err
	}
	if d.closed.Load() {
		return driver.ErrClosed
	}
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	bc := d.c.NewBlobClient(blobName(key))
	props, err := bc.GetProperties(ctx, nil)
	if err != nil {
		if bloberror.HasCode(err, lostCodes...) {
			return driver.ErrLeaseLost
		}
		return storeErr("release", err)
	}
	if !held(props.LeaseState) {
		return driver.ErrLeaseLost
	}
	lc, err := lease.NewBlobClient(bc, &lease.BlobClientOptions{LeaseID: to.Ptr(LeaseID(owner))})
	if err != nil {
		return fmt.Errorf("azblobdriver: release: %w", err)
	}
	if _, err := lc.ReleaseLease(ctx, nil); err != nil {
		if bloberror.HasCode(err, lostCodes...) {
			return driver.ErrLeaseLost
		}
		return storeErr("release", err)
	}
	return nil
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

// Close ends the calls in flight, gives acquisition attempts finishing in
// the background closeGrace (100 ms) before it interrupts them, and closes
// the idle connections of the transport that Open created. Grants stay on
// the service and expire with their leases. Closing twice returns nil.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		d.closed.Store(true)
		d.close()
		done := make(chan struct{})
		go func() { d.bg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(closeGrace):
			d.abort()
			<-done
		}
		d.abort()
		if d.transport != nil {
			d.transport.CloseIdleConnections()
		}
	})
	return nil
}

// info describes the grant that a lock blob's properties show.
func info(key string, md map[string]*string) driver.HolderInfo {
	hi := driver.HolderInfo{Key: key, Waiters: -1}
	hi.Fence, _ = fenceOf(md)
	if v, ok := meta(md, metaHolder); ok {
		if h, err := url.PathUnescape(v); err == nil {
			hi.Holder = h
		} else {
			hi.Holder = v
		}
	}
	if v, ok := meta(md, metaTTL); ok {
		hi.TTL, _ = time.ParseDuration(v)
	}
	return hi
}

// Inspect implements driver.Inspector: the lease state and metadata of the
// key's blob. Remaining is 0 (the service does not report a lease's time
// left); Waiters is -1.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("azblobdriver: inspect: %w", err)
	}
	if d.closed.Load() {
		return driver.HolderInfo{}, driver.ErrClosed
	}
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	free := driver.HolderInfo{Key: key, Waiters: -1}
	props, err := d.c.NewBlobClient(blobName(key)).GetProperties(ctx, nil)
	if err != nil {
		if bloberror.HasCode(err, bloberror.BlobNotFound, bloberror.ContainerNotFound) {
			return free, fmt.Errorf("azblobdriver: inspect %q: %w", key, driver.ErrNotAcquired)
		}
		return driver.HolderInfo{}, storeErr("inspect", err)
	}
	if !held(props.LeaseState) {
		return free, fmt.Errorf("azblobdriver: inspect %q: %w", key, driver.ErrNotAcquired)
	}
	return info(key, props.Metadata), nil
}

// List implements driver.Inspector: the held keys that start with prefix,
// sorted by key bytes, from one listing of the container (blobs whose
// names are not lock blobs are skipped).
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	if d.closed.Load() {
		return nil, driver.ErrClosed
	}
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	p := blobName(prefix)
	opts := &container.ListBlobsFlatOptions{Include: container.ListBlobsInclude{Metadata: true}}
	if p != "" {
		opts.Prefix = &p
	}
	pager := d.c.NewListBlobsFlatPager(opts)
	var out []driver.HolderInfo
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			if bloberror.HasCode(err, bloberror.ContainerNotFound) {
				return nil, nil
			}
			return nil, storeErr("list", err)
		}
		for _, item := range page.Segment.BlobItems {
			if item == nil || item.Name == nil || item.Properties == nil || !held(item.Properties.LeaseState) {
				continue
			}
			key, ok := keyOf(*item.Name)
			if !ok || !strings.HasPrefix(key, prefix) {
				continue
			}
			out = append(out, info(key, item.Metadata))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// ForceRelease implements driver.ForceReleaser: it breaks the key's lease
// with a break period of 0, conditioned on the ETag it read, and returns
// the grant it read just before. When the key was granted again between
// the read and the break, nothing is broken and the error says the key
// changed (run it again to break the new grant). The reason is not kept
// (the service has no log for it).
func (d *Driver) ForceRelease(ctx context.Context, key, reason string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("azblobdriver: force release: %w", err)
	}
	if d.closed.Load() {
		return driver.HolderInfo{}, driver.ErrClosed
	}
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	bc := d.c.NewBlobClient(blobName(key))
	free := driver.HolderInfo{Key: key, Waiters: -1}
	props, err := bc.GetProperties(ctx, nil)
	if err != nil {
		if bloberror.HasCode(err, bloberror.BlobNotFound, bloberror.ContainerNotFound) {
			return free, fmt.Errorf("azblobdriver: force release %q: %w", key, driver.ErrNotAcquired)
		}
		return driver.HolderInfo{}, storeErr("force release", err)
	}
	if !held(props.LeaseState) {
		return free, fmt.Errorf("azblobdriver: force release %q: %w", key, driver.ErrNotAcquired)
	}
	if props.ETag == nil {
		return driver.HolderInfo{}, fmt.Errorf("azblobdriver: force release %q: the service returned no ETag for blob %s", key, blobName(key))
	}
	hi := info(key, props.Metadata)
	lc, err := lease.NewBlobClient(bc, nil)
	if err != nil {
		return driver.HolderInfo{}, fmt.Errorf("azblobdriver: force release: %w", err)
	}
	// If-Match on the ETag read: every grant writes the blob's metadata,
	// so a grant made since the read (after the one read was released,
	// broken or expired) has moved the ETag and is never broken here.
	_, err = lc.BreakLease(ctx, &lease.BlobBreakOptions{
		BreakPeriod:              to.Ptr(int32(0)),
		ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: props.ETag},
	})
	if err != nil {
		switch {
		case bloberror.HasCode(err, bloberror.LeaseNotPresentWithLeaseOperation, bloberror.BlobNotFound, bloberror.ContainerNotFound):
			return free, fmt.Errorf("azblobdriver: force release %q: %w", key, driver.ErrNotAcquired)
		case bloberror.HasCode(err, bloberror.ConditionNotMet):
			// Another grant came after the one read: it is not the one
			// this call reports, so it is left alone. Like the other
			// drivers' force releases, a plain error: running it again
			// reads and breaks the new grant.
			return driver.HolderInfo{}, fmt.Errorf("azblobdriver: force release %q: the key changed since it was read (the grant of fence %d ended and the key was granted again); nothing was broken, run it again", key, hi.Fence)
		}
		return driver.HolderInfo{}, storeErr("force release", err)
	}
	return hi, nil
}

// storeError is a failure of one request to the Blob service, shown in
// one line (azcore's own message spans several, with the response body).
// kind, when set, is the sentinel it matches besides the response error.
type storeError struct {
	op   string
	kind error
	err  *azcore.ResponseError
}

func (e *storeError) Error() string {
	code := e.err.ErrorCode
	if code == "" {
		code = http.StatusText(e.err.StatusCode)
	}
	kind := ""
	if e.kind != nil {
		kind = e.kind.Error() + ": "
	}
	return fmt.Sprintf("azblobdriver: %s: %sthe Blob service answered HTTP %d %s", e.op, kind, e.err.StatusCode, code)
}

func (e *storeError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}

// storeErr wraps a failed request of op. An answer refusing the caller's
// credentials matches driver.ErrPermissionDenied, and one refusing the
// request as malformed matches driver.ErrInvalidArgument: retrying cannot
// help, and neither may pass for an outage. Any other error (no answer,
// a 5xx) is a store error, reported as driver.ErrUnavailable.
func storeErr(op string, err error) error {
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return fmt.Errorf("azblobdriver: %s: %w", op, err)
	}
	se := &storeError{op: op, err: re}
	switch {
	case re.StatusCode == http.StatusForbidden || re.StatusCode == http.StatusUnauthorized:
		se.kind = driver.ErrPermissionDenied
	case re.StatusCode == http.StatusBadRequest || re.StatusCode == http.StatusRequestURITooLong:
		se.kind = driver.ErrInvalidArgument
	}
	return se
}
