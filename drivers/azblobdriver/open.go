package azblobdriver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// EmulatorAccount is the development account of the Azurite emulator, the
// only account auth=emulator accepts.
const EmulatorAccount = "devstoreaccount1"

// EmulatorKey is the account key of EmulatorAccount that Microsoft
// publishes in Azurite's documentation ("well-known storage account and
// key"): it is the same on every emulator and protects nothing. auth=emulator
// uses it.
const EmulatorKey = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

// KeyEnv is the environment variable that auth=sharedkey reads the account
// key from (the name the Azure CLI reads).
const KeyEnv = "AZURE_STORAGE_KEY"

// openProbeTimeout bounds Open's check of the container when ctx has no
// earlier deadline.
const openProbeTimeout = 10 * time.Second

// config is a parsed azblob:// URL.
type config struct {
	account, container, endpoint, auth string
	create                             bool
}

func (c config) containerURL() string { return strings.TrimRight(c.endpoint, "/") + "/" + c.container }

// parseURL checks an azblob:// URL (see the package doc); every error
// matches driver.ErrInvalidArgument.
func parseURL(u *url.URL) (config, error) {
	const shape = "azblob://ACCOUNT/CONTAINER?endpoint=URL&auth=default|sharedkey|emulator"
	var c config
	if u.Scheme != "azblob" {
		return c, urlparam.Invalid("azblobdriver: URL scheme %q is not azblob", u.Scheme)
	}
	if u.User != nil {
		return c, urlparam.Invalid("azblobdriver: the URL carries a user or password; credentials come from auth= (want %s)", shape)
	}
	if u.Opaque != "" || u.Fragment != "" {
		return c, urlparam.Invalid("azblobdriver: malformed URL (want %s)", shape)
	}
	c.account = u.Host
	if err := checkAccount(c.account); err != nil {
		return c, err
	}
	c.container = strings.TrimPrefix(u.Path, "/")
	if err := checkContainer(c.container); err != nil {
		return c, err
	}
	q := u.Query()
	if err := urlparam.Known("azblobdriver", q, "endpoint", "auth", "create_container"); err != nil {
		return c, err
	}
	for name, vals := range q {
		if len(vals) > 1 {
			return c, urlparam.Invalid("azblobdriver: URL parameter %s is given %d times", name, len(vals))
		}
	}
	c.endpoint = q.Get("endpoint")
	if c.endpoint == "" {
		c.endpoint = "https://" + c.account + ".blob.core.windows.net"
	}
	eu, err := url.Parse(c.endpoint)
	switch {
	case err != nil:
		return c, urlparam.Invalid("azblobdriver: endpoint %q is not a URL", c.endpoint)
	case eu.Scheme != "http" && eu.Scheme != "https":
		return c, urlparam.Invalid("azblobdriver: endpoint %q is not an http:// or https:// URL", c.endpoint)
	case eu.Host == "":
		return c, urlparam.Invalid("azblobdriver: endpoint %q names no host", c.endpoint)
	case eu.RawQuery != "" || eu.Fragment != "" || eu.User != nil:
		// A SAS token or a password would land in logs with the URL.
		return c, urlparam.Invalid("azblobdriver: endpoint must be a bare service URL, without a query, fragment or user (SAS tokens are not supported; use auth=)")
	}
	if err := urlparam.Port("azblobdriver", eu.Host); err != nil {
		return c, err
	}
	c.auth = q.Get("auth")
	switch c.auth {
	case "":
		c.auth = "default"
	case "default", "sharedkey", "emulator":
	default:
		return c, urlparam.Invalid("azblobdriver: auth=%q, want default, sharedkey or emulator", c.auth)
	}
	if c.auth == "default" && eu.Scheme != "https" {
		return c, urlparam.Invalid("azblobdriver: auth=default sends a bearer token, which needs an https endpoint (got %s); use auth=emulator for the emulator", eu.Scheme)
	}
	if c.auth == "emulator" && c.account != EmulatorAccount {
		return c, urlparam.Invalid("azblobdriver: auth=emulator is the emulator's development account %s, not %q", EmulatorAccount, c.account)
	}
	c.create = true
	if v := q.Get("create_container"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return c, urlparam.Invalid("azblobdriver: create_container=%q is not true or false", v)
		}
		c.create = b
	}
	return c, nil
}

// checkAccount checks a storage account name: 3 to 24 lowercase letters
// and digits.
func checkAccount(a string) error {
	if len(a) < 3 || len(a) > 24 {
		return urlparam.Invalid("azblobdriver: storage account %q: want 3 to 24 lowercase letters and digits (azblob://ACCOUNT/CONTAINER)", a)
	}
	for i := 0; i < len(a); i++ {
		if c := a[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return urlparam.Invalid("azblobdriver: storage account %q: byte %d is %q; want lowercase letters and digits", a, i, c)
		}
	}
	return nil
}

// checkContainer checks a container name: 3 to 63 lowercase letters,
// digits and hyphens, starting and ending with a letter or digit, no two
// hyphens in a row.
func checkContainer(c string) error {
	if len(c) < 3 || len(c) > 63 {
		return urlparam.Invalid("azblobdriver: container %q: want 3 to 63 lowercase letters, digits and hyphens (azblob://ACCOUNT/CONTAINER)", c)
	}
	for i := 0; i < len(c); i++ {
		ch := c[i]
		switch {
		case 'a' <= ch && ch <= 'z', '0' <= ch && ch <= '9':
		case ch == '-' && i > 0 && i < len(c)-1 && c[i-1] != '-':
		default:
			return urlparam.Invalid("azblobdriver: container %q: byte %d is %q; want lowercase letters, digits and single hyphens inside the name", c, i, ch)
		}
	}
	return nil
}

// Open opens a driver on an azblob:// URL (see the package doc), with its
// own HTTP transport that Close closes. It checks the container, creating
// it when missing unless create_container=false: it returns an error
// matching driver.ErrUnavailable when the service cannot be reached,
// driver.ErrPermissionDenied when it refuses the credentials, and
// driver.ErrInvalidArgument for a bad URL or missing credentials.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err
		}
		return nil, urlparam.Wrap("azblobdriver", err)
	}
	return open(ctx, u)
}

func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) { return open(ctx, u) }

func open(ctx context.Context, u *url.URL) (*Driver, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	d, err := newDriver(cfg)
	if err != nil {
		return nil, err
	}
	if err := d.probe(ctx); err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

// newDriver makes the driver of cfg, with its own transport and the
// credential auth= names. It does no I/O.
func newDriver(cfg config) (*Driver, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = 256 // many leases of one process renew at once
	opts := &container.ClientOptions{ClientOptions: azcore.ClientOptions{
		Transport: &http.Client{Transport: tr},
		Retry:     policy.RetryOptions{MaxRetries: -1}, // one try: the root package retries
		Telemetry: policy.TelemetryOptions{ApplicationID: "dlock"},
	}}
	var c *container.Client
	switch cfg.auth {
	case "default":
		cred, err := azidentity.NewDefaultAzureCredential(nil)
		if err != nil {
			return nil, urlparam.Wrap("azblobdriver: auth=default", err)
		}
		c, err = container.NewClient(cfg.containerURL(), cred, opts)
		if err != nil {
			return nil, urlparam.Wrap("azblobdriver", err)
		}
	case "sharedkey", "emulator":
		key := EmulatorKey
		if cfg.auth == "sharedkey" {
			key = os.Getenv(KeyEnv)
			if key == "" {
				return nil, urlparam.Invalid("azblobdriver: auth=sharedkey reads the account key from %s, which is not set", KeyEnv)
			}
		}
		cred, err := container.NewSharedKeyCredential(cfg.account, key)
		if err != nil {
			// The error may quote the key: name the variable instead.
			return nil, urlparam.Invalid("azblobdriver: auth=%s: the account key is not valid base64", cfg.auth)
		}
		c, err = container.NewClientWithSharedKeyCredential(cfg.containerURL(), cred, opts)
		if err != nil {
			return nil, urlparam.Wrap("azblobdriver", err)
		}
	}
	d, err := New(c, &Options{NoCreateContainer: !cfg.create})
	if err != nil {
		return nil, err
	}
	d.transport = tr
	return d, nil
}

// probe checks that the container exists (creating it when allowed).
func (d *Driver) probe(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, openProbeTimeout)
		defer cancel()
	}
	_, err := d.c.GetProperties(ctx, nil)
	if bloberror.HasCode(err, bloberror.ContainerNotFound) {
		err = d.ensureContainer(ctx)
		if err == nil || errors.Is(err, driver.ErrInvalidArgument) {
			return err
		}
	}
	if err == nil {
		return nil
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		if se := storeErr("open "+d.c.URL(), err); errors.Is(se, driver.ErrInvalidArgument) {
			return se // refused: credentials, permissions, a malformed request
		}
	}
	return fmt.Errorf("azblobdriver: open %s: %w: %w", d.c.URL(), driver.ErrUnavailable, err)
}
