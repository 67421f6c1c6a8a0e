package dlockddriver

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// TestGrant_LossPushedBeforeRegistration: the Watch stream's LOST for a
// grant may arrive before the acquisition's answer registers the grant
// (they travel apart). Before, that news found nothing to close and was
// dropped, and the holder learned of the loss only at its next renewal.
// Now the grant's Lost channel is closed from the start, with the server's
// reason kept; news of an older grant of the same owner token (a smaller
// fence) does not close a newer grant's channel.
func TestGrant_LossPushedBeforeRegistration(t *testing.T) {
	d := &Driver{
		lost:     make(map[grantKey]lostEntry),
		reasons:  newRecent[string](),
		early:    newRecent[uint64](),
		watchCtx: context.Background(),
	}
	req := driver.AcquireRequest{Key: "k", Owner: "owner-1", TTL: time.Second}

	d.markLost(req.Key, req.Owner, 7, "FORCE_RELEASED")
	g := d.grant(req, 7)
	if !isClosed(g.Lost) {
		t.Fatal("a grant whose LOST came before its registration has an open Lost channel")
	}
	if r := d.lossReason(req.Key, req.Owner); r != "an operator force-released it" {
		t.Fatalf("loss reason %q, want the server's FORCE_RELEASED", r)
	}

	// An older grant's news (fence 7) does not end the next grant (fence 9).
	g = d.grant(req, 9)
	if isClosed(g.Lost) {
		t.Fatal("an older grant's early loss closed a newer grant's Lost channel")
	}
	if r := d.lossReason(req.Key, req.Owner); r != "" {
		t.Fatalf("loss reason of the new grant %q, want none", r)
	}
	// Its own loss, pushed after registration, still closes it.
	d.markLost(req.Key, req.Owner, 9, "EXPIRED")
	if !isClosed(g.Lost) {
		t.Fatal("a loss pushed after registration did not close the Lost channel")
	}

	// An older grant of the owner token still registered (a handed grant
	// whose claim failed) does not hide the next grant's early loss.
	req2 := driver.AcquireRequest{Key: "k2", Owner: "owner-2", TTL: time.Second}
	old := d.grant(req2, 7)
	d.markLost(req2.Key, req2.Owner, 11, "FORCE_RELEASED")
	g = d.grant(req2, 11)
	if !isClosed(g.Lost) {
		t.Fatal("an early loss with an older grant still registered was not kept")
	}
	if !isClosed(old.Lost) {
		t.Fatal("the older registration was left open beside the newer lost grant")
	}
	if r := d.lossReason(req2.Key, req2.Owner); r != "an operator force-released it" {
		t.Fatalf("loss reason %q, want the server's FORCE_RELEASED", r)
	}

	// Early news is bounded.
	for i := range 3 * maxLossReasons {
		d.markLost("other", "owner-"+string(rune('a'+i%26))+time.Duration(i).String(), uint64(i+1), "EXPIRED")
	}
	if len(d.early.m) > maxLossReasons || len(d.early.order) > maxLossReasons {
		t.Fatalf("%d early losses kept (%d in order), want at most %d", len(d.early.m), len(d.early.order), maxLossReasons)
	}
}

// isClosed reports whether ch is closed (or holds a value) now.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
