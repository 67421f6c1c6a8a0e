package cli

import (
	"testing"
	"time"
)

// TestResume_HoldLeftWithinMaxHold: what is left of --max-hold for a
// resumed lease lies in [0, maxHold]: a grant in the future (the clock was
// stepped back, the file edited) counts as now, never as extra time.
func TestResume_HoldLeftWithinMaxHold(t *testing.T) {
	now := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	const maxHold = 10 * time.Minute
	cases := []struct {
		name    string
		granted time.Time
		want    time.Duration
	}{
		{"now", now, maxHold},
		{"4 min ago", now.Add(-4 * time.Minute), 6 * time.Minute},
		{"exactly max-hold ago", now.Add(-maxHold), 0},
		{"long ago", now.Add(-48 * time.Hour), 0},
		{"far past", time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), 0},
		{"1 h in the future", now.Add(time.Hour), maxHold},
		{"far future", time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), maxHold},
	}
	for _, c := range cases {
		if got := holdLeft(maxHold, c.granted, now); got != c.want {
			t.Errorf("%s: holdLeft = %v, want %v", c.name, got, c.want)
		}
	}
}
