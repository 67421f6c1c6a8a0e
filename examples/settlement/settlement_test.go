package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server/servertest"
)

// run settles with a paused worker and checks the outcome the brief demands:
// every merchant settled exactly once, the paused worker's late write
// rejected by the fence.
func run(t *testing.T, store, ledger string) Report {
	t.Helper()
	return runTTL(t, store, ledger, 300*time.Millisecond)
}

// runTTL is run with leases of ttl, and the paused worker stopped for
// twice that.
func runTTL(t *testing.T, store, ledger string, ttl time.Duration) Report {
	t.Helper()
	cfg := Config{
		Store: store, Ledger: ledger, Merchants: 200, Workers: 8,
		TTL: ttl, Date: "2026-09-30", PauseWorker: 3, Pause: 2 * ttl,
	}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.Settled != cfg.Merchants || rep.Duplicates != 0 {
		t.Fatalf("settled %d of %d, duplicates %d", rep.Settled, cfg.Merchants, rep.Duplicates)
	}
	if rep.StaleRejected != 1 {
		t.Errorf("stale writes rejected = %d, want the paused worker's one", rep.StaleRejected)
	}
	if rep.Lock.LostWhileWorking < 1 {
		t.Errorf("no lease lost while working, but a worker was paused past its TTL")
	}
	if rep.Lock.Acquisitions < cfg.Merchants {
		t.Errorf("%d acquisitions for %d merchants", rep.Lock.Acquisitions, cfg.Merchants)
	}
	return rep
}

func TestSettlement_MemStoreSQLiteLedger(t *testing.T) {
	run(t, "mem://settlement-test", "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"))
}

func TestSettlement_RedisStorePostgresLedger(t *testing.T) {
	r := testservers.StartRedis(t)
	pg := testservers.StartPostgres(t)
	run(t, r.URL(), pg.URL())
}

func TestSettlement_RedisStoreSQLiteLedger(t *testing.T) {
	r := testservers.StartRedis(t)
	run(t, r.URL(), "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"))
}

func TestSettlement_PostgresStorePostgresLedger(t *testing.T) {
	pg := testservers.StartPostgres(t)
	run(t, pg.URL(), pg.URL())
}

func TestSettlement_DlockdStoreSQLiteLedger(t *testing.T) {
	d := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	run(t, "dlockd://"+d.Addr(), "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"))
}

// TestSettlement_AzblobStoreSQLiteLedger runs on Azure blob leases (the
// Azurite emulator): the paused worker's key is taken over only when its
// 15 s service lease (Azure's shortest) has ended, long after its 300 ms TTL.
func TestSettlement_AzblobStoreSQLiteLedger(t *testing.T) {
	az := testservers.StartAzurite(t)
	run(t, az.URL("settlement"), "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"))
}

// TestSettlement_DynamoDBStoreSQLiteLedger runs on DynamoDB conditional
// writes (the dynalite emulator): the paused worker's key is taken over by
// a worker that has seen its record version unchanged for a lease. Leases
// of 2 s: dynalite is one Node.js process, and under the race detector on
// a loaded 2-core machine its acquisitions took longer than a 300 ms TTL,
// so every grant arrived already past its validity and the run made no
// progress (a grant is never trusted past sent + TTL − drift).
func TestSettlement_DynamoDBStoreSQLiteLedger(t *testing.T) {
	d := testservers.StartDynalite(t)
	testservers.UseDynaliteEnv(t)
	runTTL(t, d.URL("settlement")+"&create_table=true", "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"), 2*time.Second)
}
