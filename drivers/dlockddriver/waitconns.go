package dlockddriver

import (
	"sync"

	"google.golang.org/grpc"
)

// This file keeps Wait streams from taking every stream of a connection.
// A Wait holds its HTTP/2 stream until it is granted or given up, and
// dlockd allows 1,024 concurrent streams per connection by default
// (--max-streams-per-connection); grpc-go holds a new stream past the limit
// until one ends. About a thousand Waits of one process on one connection
// would leave no stream for that connection's unary calls (Inspect, List,
// ForceRelease: they waited their op timeout and failed as unavailable) and
// would keep the rest of the Waits out of the server's queue, where their
// FIFO place is.

// WaitsPerConn is the most Wait streams that one gRPC connection carries at
// once. Past it, the next Wait goes on another connection to the same
// member, dialled for Waits with the same options and kept until the
// connection it overflows from is closed; each of those carries up to
// WaitsPerConn Waits too. With dlockd's default of 1,024 streams per
// connection this leaves about 500 streams of the first connection for
// unary calls and the Session and Watch streams of the Drivers sharing it
// (DriversPerConn). A dlockd run with --max-streams-per-connection below
// about 600 should expect a process's unary calls to wait behind its Waits
// once this many wait at once.
const WaitsPerConn = 512

// waitConns counts the Wait streams open on one connection (the first) and
// on the extra connections dialled for Waits beyond WaitsPerConn.
type waitConns struct {
	first *grpc.ClientConn
	dial  func() (*grpc.ClientConn, error)

	mu     sync.Mutex
	open   int          // Waits on first
	extras []*extraConn // in dial order
	closed bool
}

// extraConn is a connection dialled for Waits, and how many it carries.
type extraConn struct {
	cc   *grpc.ClientConn
	open int
}

// newWaitConns returns the Wait counts of first; dial makes an extra
// connection to the same member.
func newWaitConns(first *grpc.ClientConn, dial func() (*grpc.ClientConn, error)) *waitConns {
	return &waitConns{first: first, dial: dial}
}

// get returns a connection with room for one more Wait, dialling an extra
// one when every one has WaitsPerConn, and counts the Wait; done gives the
// place back (once; later calls do nothing). A failed dial (not expected:
// the options were checked when the Driver was made) or a closed set puts
// the Wait on the first connection, where it waits for a stream as before.
func (w *waitConns) get() (cc *grpc.ClientConn, done func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.open < WaitsPerConn || w.closed {
		w.open++
		return w.first, w.once(func() { w.open-- })
	}
	for _, x := range w.extras {
		if x.open < WaitsPerConn {
			return x.cc, w.take(x)
		}
	}
	cc, err := w.dial()
	if err != nil {
		w.open++
		return w.first, w.once(func() { w.open-- })
	}
	x := &extraConn{cc: cc}
	w.extras = append(w.extras, x)
	return x.cc, w.take(x)
}

// take counts one Wait on x and returns its done.
func (w *waitConns) take(x *extraConn) func() {
	x.open++
	return w.once(func() { x.open-- })
}

// once returns a function that runs give (under w.mu) the first time it is
// called.
func (w *waitConns) once(give func()) func() {
	var o sync.Once
	return func() {
		o.Do(func() {
			w.mu.Lock()
			give()
			w.mu.Unlock()
		})
	}
}

// counts returns the Waits open on the first connection and on each extra
// one (for tests).
func (w *waitConns) counts() (first int, extras []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.extras {
		extras = append(extras, x.open)
	}
	return w.open, extras
}

// close closes the extra connections; the first is its owner's to close.
// Waits still counted on them end with them.
func (w *waitConns) close() error {
	w.mu.Lock()
	w.closed = true
	extras := w.extras
	w.extras = nil
	w.mu.Unlock()
	var first error
	for _, x := range extras {
		if err := x.cc.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
