package matrix

import (
	"context"
	"strings"
	"time"

	"github.com/dlock-dev/dlock/drivers/azblobdriver"
	"github.com/dlock-dev/dlock/drivers/dynamodbdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/internal/testservers/gcsfake"
	"github.com/dlock-dev/dlock/verify"

	// The drivers the clients open by URL (dynamodbdriver and azblobdriver
	// are imported by name above, for the table and container set-up).
	_ "github.com/dlock-dev/dlock/drivers/consuldriver"
	_ "github.com/dlock-dev/dlock/drivers/gcsdriver"
)

// The cloud stores' run TTLs (Store.TTL), longer than the matrix's 1 s
// where the store cannot honour a shorter one.
const (
	// gcsTTL: Cloud Storage takes about one write per second per object
	// name and renewals run every TTL/3, so gcsdriver asks for a TTL of
	// 3 s or more (the fake has no such limit; the matrix measures the
	// configuration the driver recommends).
	gcsTTL = 3 * time.Second
	// azblobTTL: a blob lease lasts at least 15 s, and azblobdriver leases
	// for max(TTL, 15 s). At a shorter TTL a dead or cut-off holder's key
	// would stay leased for 15 s whatever the TTL, so faults sized in TTLs
	// would not reach the store's expiry; at 15 s the TTL is the lease.
	azblobTTL = azblobdriver.MinServiceLease
)

// setupTimeout bounds the one-off set-up request (a table, a container)
// a cloud target makes before the clients open.
const setupTimeout = 30 * time.Second

// consulTarget is one Consul server agent (Raft on disk, so a restart
// keeps keys, sessions and Raft indexes: the fences) behind a proxy.
type consulTarget struct {
	base
	c *testservers.Consul
}

func startConsul(h *testservers.Harness, seed uint64) *consulTarget {
	c := testservers.StartConsul(h)
	links, hosts := proxied(h, seed, c.Addr())
	// consul://HOST/prefix: the proxy takes the agent's HTTP address.
	u := strings.Replace(c.URL(), c.Addr(), hosts, 1)
	return &consulTarget{base: base{name: "consul", url: u, links: links}, c: c}
}

// Kill implements verify.Killer: SIGKILL to the agent, which Kill waits
// out.
func (t *consulTarget) Kill(context.Context) error { t.c.Kill(); return nil }

// Restart implements verify.Killer: the agent again on its ports and data
// directory, once it has a leader and its node is in the catalog.
func (t *consulTarget) Restart(context.Context) error {
	return t.restarted(t.c.Start())
}

// dynamoTarget is dynalite (DynamoDB's API on LevelDB) behind a proxy.
type dynamoTarget struct {
	base
	d *testservers.Dynalite
}

// dynamoTable is the lock table of the verifier's dynalite.
const dynamoTable = "dlock_verify"

func startDynamo(h *testservers.Harness, seed uint64) *dynamoTarget {
	// The AWS SDK reads credentials and region from the environment: the
	// emulator's fixed ones, and nothing of the machine's (no shared
	// config, no instance metadata), until the harness closes.
	testservers.UseDynaliteEnv(h)
	d := testservers.StartDynalite(h)
	// The table is made once, straight to the server: four clients each
	// opening with create_table=true would race to create it.
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	drv, err := dynamodbdriver.Open(ctx, d.URL(dynamoTable)+"&create_table=true")
	if err != nil {
		h.Fatalf("matrix: create the dynalite table %s: %v", dynamoTable, err)
	}
	_ = drv.Close()
	links, hosts := proxied(h, seed, d.Addr())
	// dynamodb://TABLE?region=…&endpoint=http://HOST: the proxy takes the
	// endpoint's host.
	u := strings.Replace(d.URL(dynamoTable), d.Addr(), hosts, 1)
	return &dynamoTarget{base: base{name: "dynamodb", url: u, links: links}, d: d}
}

// Kill implements verify.Killer: SIGKILL to node, which Kill waits out.
// LevelDB has written every acknowledged write to its log (unsynced:
// the page cache keeps it across a process crash).
func (t *dynamoTarget) Kill(context.Context) error { t.d.Kill(); return nil }

// Restart implements verify.Killer: dynalite again on its port and
// LevelDB directory, once it answers ListTables.
func (t *dynamoTarget) Restart(context.Context) error {
	return t.restarted(t.d.Start())
}

// gcsTarget is fake-gcs-server inside the verifier's process, behind a
// proxy. It is no verify.Killer: its objects live in this process's
// memory, which no kill -9 can stop without stopping the verifier, and
// gcsfake's Stop and Start only close and reopen its listener (a link
// fault, which blackhole and reply-loss already are), so the kill cells
// are n/a. Cloud Storage itself is a managed service: there is no
// process of it to crash.
type gcsTarget struct {
	base
	s *gcsfake.Server
}

// gcsBucket is the verifier's bucket on the fake.
const gcsBucket = "dlock-verify"

func startGCS(h *testservers.Harness, seed uint64) *gcsTarget {
	s := gcsfake.Start(h, gcsBucket)
	links, hosts := proxied(h, seed, s.Addr())
	// gs://BUCKET/PREFIX?endpoint=http://HOST: the proxy takes the
	// endpoint's host (auth defaults to none with an endpoint).
	u := strings.Replace(s.URL(gcsBucket, "locks"), s.Addr(), hosts, 1)
	return &gcsTarget{base: base{name: "gcs", url: u, links: links}, s: s}
}

// azblobTarget is Azurite's blob service behind a proxy.
type azblobTarget struct {
	base
	a *testservers.Azurite
}

// azblobContainer is the verifier's container on Azurite.
const azblobContainer = "dlock-verify"

func startAzblob(h *testservers.Harness, seed uint64) *azblobTarget {
	a := testservers.StartAzurite(h)
	// The container is made once, straight to the server; the clients open
	// with create_container=false (the driver's advice for a container made
	// by hand), so that a container the emulator lost fails their
	// acquisitions instead of being made again with fences from 1.
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	drv, err := azblobdriver.Open(ctx, a.URL(azblobContainer))
	if err != nil {
		h.Fatalf("matrix: create the Azurite container %s: %v", azblobContainer, err)
	}
	_ = drv.Close()
	links, hosts := proxied(h, seed, a.Addr())
	// azblob://ACCOUNT/CONTAINER?endpoint=http://HOST/ACCOUNT: the proxy
	// takes the endpoint's host.
	u := testservers.AzuriteURL(hosts, azblobContainer) + "&create_container=false"
	return &azblobTarget{base: base{name: "azblob", url: u, links: links}, a: a}
}

// Kill implements verify.Killer: SIGKILL to azurite-blob (node), which
// Kill waits out. Azurite saves its metadata every 5 s, so the kill can
// lose the last fences: the emulator's weakness, which azblobdriver's doc
// states (Store.MayFail). Azurite 3.37.0 also brings back no lease after
// a restart, graceful or not (TestCloudTargets shows it; azblobdriver's
// doc does not say so): a holder's lease is gone when the emulator comes
// back, though its fence counter is kept.
func (t *azblobTarget) Kill(context.Context) error { t.a.Kill(); return nil }

// Restart implements verify.Killer: azurite-blob again on its port and
// data directory, once it answers HTTP.
func (t *azblobTarget) Restart(context.Context) error {
	return t.restarted(t.a.Start())
}

var (
	_ verify.Killer = (*consulTarget)(nil)
	_ verify.Killer = (*dynamoTarget)(nil)
	_ verify.Linked = (*gcsTarget)(nil)
	_ verify.Killer = (*azblobTarget)(nil)
)
