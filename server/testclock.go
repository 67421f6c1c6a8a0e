package server

import (
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// testClockPoll is how often the lease clock re-reads
// Config.TestClockOffsetFile.
const testClockPoll = 10 * time.Millisecond

// clockOffset is the lease clock of a server started with
// Config.TestClockOffsetFile: this process's monotonic clock plus an
// offset that the file sets, so that a fault injector (dlock verify's
// store-clock-jump) can make one node's clock jump forward while it runs.
type clockOffset struct {
	path string
	ns   atomic.Int64
}

// now returns the process's monotonic time plus the offset (time.Time.Add
// keeps the monotonic reading).
func (o *clockOffset) now() time.Time { return time.Now().Add(time.Duration(o.ns.Load())) }

// read sets the offset from the file: a Go duration ("2s", "-500ms").
// It reports whether the offset changed; a missing, empty or malformed
// file leaves the offset as it was.
func (o *clockOffset) read() (changed bool, d time.Duration, err error) {
	b, err := os.ReadFile(o.path)
	if err != nil {
		if os.IsNotExist(err) {
			return false, 0, nil
		}
		return false, 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return false, 0, nil
	}
	d, err = time.ParseDuration(s)
	if err != nil {
		return false, 0, err
	}
	return o.ns.Swap(int64(d)) != int64(d), d, nil
}

// clockOffsetLoop re-reads the offset file every testClockPoll until the
// server stops, and wakes the expiry loop when the offset moved: a clock
// that jumped forward may have ended countdowns.
func (s *Server) clockOffsetLoop(o *clockOffset) {
	defer s.loops.Done()
	t := time.NewTicker(testClockPoll)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-s.stopCh:
			return
		case <-t.C:
		}
		changed, d, err := o.read()
		switch {
		case err != nil:
			if err.Error() != lastErr {
				s.log.Warn("dlockd: test clock offset file unreadable; offset unchanged", "file", o.path, "err", err)
			}
			lastErr = err.Error()
		case changed:
			lastErr = ""
			s.log.Warn("dlockd: test clock offset moved: lease deadlines now run on a shifted clock", "file", o.path, "offset", d)
			s.clock.poke()
		}
	}
}
