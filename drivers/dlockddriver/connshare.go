package dlockddriver

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"

	"google.golang.org/grpc"
)

// This file shares gRPC connections between the Drivers of one process
// (the package doc's "Shared connections"). Why: grpc-go writes the frames
// of every stream of a connection through one writer goroutine (its "loopy
// writer"), which flushes its buffer with one write(2) only when no frame
// is left queued, so the calls of many Drivers on one connection under
// load go out in a few writes, and the server's writer of that connection
// answers them in a few writes too; an idle connection still flushes each
// message at once. With a connection per Driver every call costs at least
// a write(2) and a read(2) on each side. docs/BENCHMARKS-syscalls.md has
// the counts.

// DriversPerConn is the most Drivers that share one gRPC connection; past
// it a new connection is dialled. Each Driver keeps two streams open on it
// (Watch and Session), and each Wait and each unary call takes one more,
// while dlockd allows 1,024 streams at once per connection by default
// (--max-streams-per-connection; grpc-go queues a stream past that until
// one ends): 16 Drivers leave about 60 streams each for Waits and unary
// calls, and Waits past WaitsPerConn go on connections of their own
// (waitconns.go). At W1 c=64 (four connections) the read and write system calls per
// cycle are still about a ninth of one connection per Driver (0.7 against
// 6.1, docs/BENCHMARKS-syscalls.md; 0.4 with all 64 on one connection).
const DriversPerConn = 16

// connKey names the connections that may be shared.
type connKey struct {
	addr  string
	token string
	// TLS: both zero for plaintext; tlsID for Open's configuration (the
	// same files give the same ID); tls for Dial's, by identity (the key
	// holds it, so its address is not reused while the connection lives).
	tlsID string
	tls   *tls.Config
}

// sharedConn is one connection of the process's pool and how many
// Drivers' members use it.
type sharedConn struct {
	key   connKey
	cc    *grpc.ClientConn
	waits *waitConns // the Waits on cc, and the connections past it (waitconns.go)
	users int
}

// connPool is the process's shared connections, by key; a key has more
// than one when DriversPerConn Drivers use the first.
var connPool = struct {
	mu    sync.Mutex
	conns map[connKey][]*sharedConn
}{conns: make(map[connKey][]*sharedConn)}

// getShared returns a connection of key with room for one more user,
// dialling one with dopts if none has room, and counts the user.
func getShared(key connKey, dopts []grpc.DialOption) (*sharedConn, error) {
	connPool.mu.Lock()
	defer connPool.mu.Unlock()
	for _, sc := range connPool.conns[key] {
		if sc.users < DriversPerConn {
			sc.users++
			return sc, nil
		}
	}
	cc, err := grpc.NewClient("passthrough:///"+key.addr, dopts...)
	if err != nil {
		return nil, err
	}
	sc := &sharedConn{key: key, cc: cc, users: 1}
	sc.waits = newWaitConns(cc, func() (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///"+key.addr, dopts...)
	})
	connPool.conns[key] = append(connPool.conns[key], sc)
	return sc, nil
}

// putShared gives back one user's use of sc, and closes sc when it was
// the last.
func putShared(sc *sharedConn) error {
	connPool.mu.Lock()
	sc.users--
	last := sc.users == 0
	if last {
		list := connPool.conns[sc.key]
		for i, x := range list {
			if x == sc {
				list = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(connPool.conns, sc.key)
		} else {
			connPool.conns[sc.key] = list
		}
	}
	connPool.mu.Unlock()
	if last {
		return errors.Join(sc.waits.close(), sc.cc.Close())
	}
	return nil
}

// sharedConns returns how many shared connections the process has open
// (for tests).
func sharedConns() int {
	connPool.mu.Lock()
	defer connPool.mu.Unlock()
	n := 0
	for _, l := range connPool.conns {
		n += len(l)
	}
	return n
}

// driverConn is one Driver's use of a shared connection: every call and
// stream it starts ends when done does (the Driver closed), as it would
// when the Driver closed a connection of its own.
type driverConn struct {
	cc   *grpc.ClientConn
	done context.Context
}

var _ grpc.ClientConnInterface = driverConn{}

// Invoke implements grpc.ClientConnInterface.
func (c driverConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.done, cancel)
	defer stop()
	defer cancel()
	return c.cc.Invoke(ctx, method, args, reply, opts...)
}

// NewStream implements grpc.ClientConnInterface. The stream's context ends
// when ctx does, when the Driver closes, or when the stream ends (RecvMsg
// returns an error).
func (c driverConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.done, cancel)
	context.AfterFunc(ctx, func() { stop() }) // forget the Driver's context once the stream's ends
	s, err := c.cc.NewStream(ctx, desc, method, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &driverStream{ClientStream: s, cancel: cancel}, nil
}

// driverStream is a stream of a driverConn: its context is cancelled once
// the stream has ended, so that nothing stays registered on the Driver's.
type driverStream struct {
	grpc.ClientStream
	cancel context.CancelFunc
}

// RecvMsg implements grpc.ClientStream.
func (s *driverStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.cancel()
	}
	return err
}
