package dynamodbdriver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dynamodbdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// ignoreOpenCensus: fake-gcs-server, which the dlock CLI links (through
// verify/matrix's gcs target), starts opencensus's view worker in an init.
var ignoreOpenCensus = goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")

func TestMain(m *testing.M) {
	// dynalite accepts any credentials: the SDK's chain finds these in
	// the environment, and never goes on to instance metadata.
	testservers.SetDynaliteEnv()
	goleak.VerifyTestMain(m, ignoreOpenCensus)
}

// TestConformance runs the dlock conformance suite against dynalite (its
// tables in LevelDB, so a restart keeps them), each driver opened by URL
// with its own HTTP connections, as a process would.
func TestConformance(t *testing.T) {
	dl := testservers.StartDynalite(t)
	url := dl.URL("dlock_locks")
	migrate(t, url)
	freezer := testservers.NewFreezer(t, func() []int { return []int{dl.PID()} })
	dlocktest.Run(t, dlocktest.Harness{
		Name: "dynamodb",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			return dynamodbdriver.Open(ctx, url)
		},
		StopStore:   dl.Stop,
		StartStore:  dl.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return dynamodbdriver.Open(ctx, strings.Replace(url, dl.Addr(), via(dl.Addr()), 1))
		},
		TTL: 500 * time.Millisecond,
	})
}

// TestDriver runs the driver's focused tests, each on its own table of one
// dynalite, in parallel (they mostly wait out leases).
func TestDriver(t *testing.T) {
	dl := testservers.StartDynalite(t)
	// Not in parallel: these change the epoch size or the environment for
	// their duration.
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, *store)
	}{
		{"Fence_ExhaustedEpochDrawsANewOne", testFenceExhaustedEpochDrawsANewOne},
		{"Open_InvalidURLIsInvalidArgument", testOpenInvalidURLIsInvalidArgument},
		{"Open_ByURL", testOpenByURL},
		{"Open_NoCredentialsIsPermissionDenied", testOpenNoCredentialsIsPermissionDenied},
		{"CLI_StatusListRelease", testCLIStatusListRelease},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t, dl)) })
	}
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, *store)
	}{
		{"Takeover_LiveHolderIsNeverTakenOver", testTakeoverLiveHolderIsNeverTakenOver},
		{"Takeover_DeadHolderAfterOwnObservation", testTakeoverDeadHolderAfterOwnObservation},
		{"Takeover_RenewalBeforeTakeoverWins", testTakeoverRenewalBeforeTakeoverWins},
		{"Takeover_LeaseIsTheHolders", testTakeoverLeaseIsTheHolders},
		{"Ambiguous_RenewalReplyLostIsNotALoss", testAmbiguousRenewalReplyLostIsNotALoss},
		{"Ambiguous_GrantReplyLostIsAdopted", testAmbiguousGrantReplyLostIsAdopted},
		{"Ambiguous_LeaseSurvivesALostRenewalReply", testAmbiguousLeaseSurvivesALostRenewalReply},
		{"Fence_EpochAndCounter", testFenceEpochAndCounter},
		{"Fence_IncreasesAcrossItemDeletion", testFenceIncreasesAcrossItemDeletion},
		{"GC_ReleaseMarksFreeItemsForTTL", testGCReleaseMarksFreeItemsForTTL},
		{"Open_MissingTableSaysHowToCreate", testOpenMissingTableSaysHowToCreate},
		{"Open_WrongKeySchemaIsRefused", testOpenWrongKeySchemaIsRefused},
		{"Inspect_HolderFenceTimeLeft", testInspectHolderFenceTimeLeft},
		{"List_PrefixSortedHeldOnly", testListPrefixSortedHeldOnly},
		{"ForceRelease_FreesAndFences", testForceReleaseFreesAndFences},
		{"Fault_UnreachableFailsClosed", testFaultUnreachableFailsClosed},
		{"Fault_PausedHolderTakenOverWithGreaterFence", testFaultPausedHolderTakenOverWithGreaterFence},
		{"Fault_CorruptItemIsPermanent", testFaultCorruptItemIsPermanent},
		{"Fence_EpochsExhaustedIsPermanent", testFenceEpochsExhaustedIsPermanent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t, dl))
		})
	}
}

// migrate creates the table of url (Open with create_table=true).
func migrate(t testing.TB, url string) {
	t.Helper()
	d, err := dynamodbdriver.Open(t.Context(), url+"&create_table=true")
	if err != nil {
		t.Fatalf("creating the table: %v", err)
	}
	_ = d.Close()
}
