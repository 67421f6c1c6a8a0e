package server

// Leader hints and forwarding (issue 10, "clients reach the leader").
//
// Any member serves any client:
//
//   - A node that is not ready (a follower, a candidate, a deposed leader,
//     or the leader still catching up on its log) answers a call it cannot
//     serve UNAVAILABLE with reason NOT_LEADER and a leader hint: over gRPC
//     an errdetails.ErrorInfo detail {Reason: NOT_LEADER, Domain: dlockd,
//     Metadata: leader_id, leader_api}; over HTTP a 503 whose JSON body has
//     "leader" and "leader_id", and the header Dlock-Leader. Values are
//     empty when the node knows no leader (an election is running). A hint
//     naming the node that answered means it is the leader catching up: a
//     client must not retry it in a loop, but after a pause (or try
//     another member).
//   - Unary Lock calls and /v1/ HTTP routes are forwarded by such a node
//     to the leader's API address (marked dlock-forwarded: 1), and the
//     leader's answer (or error, with its details) is returned as is. A
//     marked call is never forwarded again: a node that is not ready
//     answers it NOT_LEADER with its own hint (a stale view of the leader
//     costs one hop, never a loop). Nothing is forwarded when the leader is
//     unknown or is this node: the call is answered NOT_LEADER at once. A
//     leader whose API does not answer is reported NOT_LEADER with the hint
//     within the call's deadline (forwardDialTimeout at most to connect),
//     so that the client may reach it directly. An HTTP request with
//     Dlock-No-Forward: 1 gets a 307 redirect to the leader instead.
//   - Forwarded calls count against this node's limits (connections,
//     request size, waiting requests) as its own calls do; a body over the
//     size limit is refused before anything is forwarded.
//   - Session and Wait streams are not forwarded: a node that is not ready
//     ends them at once with NOT_LEADER and the hint. Watch is served by
//     every node: loss events come from applying the log, on every node.
//   - /healthz, /readyz and /metrics answer for the node itself.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// The wire names of leader hints and forwarding.
const (
	// ErrorDomain is the Domain of the errdetails.ErrorInfo detail of a
	// NOT_LEADER answer; its Reason is ReasonNotLeader and its Metadata
	// holds MetaLeaderID and MetaLeaderAPI (empty values when this node
	// does not know the leader).
	ErrorDomain = "dlockd"
	// MetaLeaderID is the ErrorInfo metadata key of the leader's node ID.
	MetaLeaderID = "leader_id"
	// MetaLeaderAPI is the ErrorInfo metadata key of the leader's API
	// address (host:port), the address to send the call to.
	MetaLeaderAPI = "leader_api"

	// HeaderLeader is the HTTP response header of a NOT_LEADER answer (and
	// of a 307 redirect): the leader's API address, empty when unknown.
	HeaderLeader = "Dlock-Leader"
	// HeaderForwarded marks a call forwarded by a member (HTTP header, and
	// gRPC metadata key in lower case): the node receiving it answers it
	// itself and never forwards it again.
	HeaderForwarded = "Dlock-Forwarded"
	// HeaderNoForward, set to 1 on an HTTP request to a node that is not
	// the leader, asks for a 307 redirect to the leader instead of
	// forwarding.
	HeaderNoForward = "Dlock-No-Forward"
)

// mdForwarded is HeaderForwarded as a gRPC metadata key.
const mdForwarded = "dlock-forwarded"

// forwardDialTimeout bounds the connection to the leader's API of a
// forwarded call: past it (or past three quarters of the call's own
// deadline, if sooner) the call is answered UNAVAILABLE (NOT_LEADER) with
// the leader hint, so that the client can try the leader directly.
const forwardDialTimeout = 2 * time.Second

// leaderHint names the leader as a node knows it: its node ID and API
// address, each "" when unknown.
type leaderHint struct{ id, api string }

func (h *leaderHint) String() string {
	switch {
	case h.id == "" && h.api == "":
		return "leader unknown"
	case h.api == "":
		return fmt.Sprintf("leader %s, API address unknown", h.id)
	default:
		return fmt.Sprintf("leader %s at %s", h.id, h.api)
	}
}

// grpcStatus is the status of e: its code and message, and for an answer
// with a leader hint an errdetails.ErrorInfo detail (Reason NOT_LEADER,
// Domain ErrorDomain, Metadata leader_id and leader_api).
func (e *apiError) grpcStatus() *status.Status {
	st := status.New(e.code, e.Error())
	if e.leader == nil {
		return st
	}
	d, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason: e.reason, Domain: ErrorDomain,
		Metadata: map[string]string{MetaLeaderID: e.leader.id, MetaLeaderAPI: e.leader.api},
	})
	if err != nil {
		return st
	}
	return d
}

// currentLeader returns the leader's node ID and API address as this node
// knows them ("" when unknown). On a leader that is still catching up it is
// this node itself.
func (s *Server) currentLeader() (id, api string) { return s.leaderAPI() }

// notLeader returns UNAVAILABLE (NOT_LEADER) with the message format
// makes, followed by the leader as this node knows it, and the leader hint
// that clients follow. A client must not retry at once a hint that names
// the node that answered: that node is the leader still catching up (a
// new leader applies its log before it serves), and a retry after a short
// pause, there or elsewhere, is the way.
func (s *Server) notLeader(format string, a ...any) error {
	id, api := s.currentLeader()
	h := &leaderHint{id: id, api: api}
	return &apiError{code: codes.Unavailable, reason: ReasonNotLeader, msg: fmt.Sprintf(format, a...) + "; " + h.String(), leader: h}
}

// forwardTo returns the API address of the leader to forward a call to,
// or "" when this node answers the call itself: it is ready (the leader),
// it is shutting down, the leader is unknown (the call is then answered
// NOT_LEADER at once, with what hint there is), or the leader is this node
// still catching up (NOT_LEADER naming itself).
func (s *Server) forwardTo() string {
	if s.ready.Load() {
		return ""
	}
	select {
	case <-s.closing:
		return ""
	default:
	}
	id, api := s.currentLeader()
	if id == "" || api == "" || id == s.cfg.NodeID {
		return ""
	}
	return api
}

// forwardContext returns ctx, also cancelled when the server starts
// shutting down, so that a forwarded wait never holds up a graceful stop
// (its cancellation reaches the leader, which removes the queue entry).
func (s *Server) forwardContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := make(chan struct{})
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		case <-stop:
		}
	}()
	return ctx, func() { close(stop); cancel() }
}

// forwardCap bounds a forwarded call that does not wait by design (all but
// acquisitions with wait), when the client gave it no shorter deadline: a
// leader that accepted the connection but never answers (paused) then
// yields NOT_LEADER with the hint rather than a call that hangs. The
// leader itself answers such a call within ApplyTimeout or so.
func (s *Server) forwardCap() time.Duration { return 2*s.cfg.ApplyTimeout + forwardDialTimeout }

// unreachable is the answer to a call this node could not forward: the
// leader at api did not answer. It is NOT_LEADER with the hint, so that a
// client tries the leader directly.
func (s *Server) unreachable(api string, err error) error {
	return s.notLeader("not the leader, and the leader's API %s did not answer this node: %v", api, err)
}

// grpcForwarder forwards unary gRPC calls of a node that is not the leader
// to the leader, over one cached client connection per leader address.
// The connections are closed when the server stops.
type grpcForwarder struct {
	s *Server

	mu      sync.Mutex
	conns   map[string]*fwdConn // by API address
	closed  bool
	watched bool // the goroutine that closes the connections at stop runs
}

// fwdConn is a cached connection and the forwarded calls using it.
type fwdConn struct {
	cc       *grpc.ClientConn
	inflight int
	stale    bool // no longer the leader's address: closed once unused
}

func newGRPCForwarder(s *Server) *grpcForwarder {
	return &grpcForwarder{s: s, conns: make(map[string]*fwdConn)}
}

// unaryInterceptor forwards a unary call of the Lock service to the
// leader when this node is not ready (see forwardTo). (The Cluster service
// forwards its own calls: cluster.go.) It runs after the
// node's limits, so that a forwarded call counts against them as a local
// one does. A call already forwarded to this node is never forwarded
// again: when this node is not ready it is answered NOT_LEADER with this
// node's hint.
func (f *grpcForwarder) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if f.s.ready.Load() || !strings.HasPrefix(info.FullMethod, lockMethodPrefix) {
		return h(ctx, req)
	}
	if f.s.removed.Load() { // no longer a member: it forwards nothing
		return nil, f.s.removedErr()
	}
	if forwardedGRPC(ctx) {
		if err := f.s.writable(); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
	api := f.s.forwardTo()
	if api == "" {
		return h(ctx, req)
	}
	return f.forward(ctx, api, info.FullMethod, req)
}

// lockMethodPrefix starts the full method names of the Lock service.
const lockMethodPrefix = "/dlock.v1.Lock/"

// forwardedGRPC reports whether the call of ctx was forwarded by a member.
func forwardedGRPC(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(mdForwarded)) > 0
}

// replyTypes caches the response type of each forwarded method, by full
// method name.
var replyTypes sync.Map // string -> protoreflect.MessageType

// replyType returns the response message type of the unary method
// fullMethod ("/dlock.v1.Lock/Acquire"), from the registered descriptors.
func replyType(fullMethod string) (protoreflect.MessageType, error) {
	if t, ok := replyTypes.Load(fullMethod); ok {
		return t.(protoreflect.MessageType), nil
	}
	svc, m, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		return nil, fmt.Errorf("malformed method %q", fullMethod)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("method %q: %w", fullMethod, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("method %q: %s is not a service", fullMethod, svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(m))
	if md == nil || md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, fmt.Errorf("method %q: no such unary method", fullMethod)
	}
	t, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("method %q: %w", fullMethod, err)
	}
	replyTypes.Store(fullMethod, t)
	return t, nil
}

// forward sends req to the leader's API at api and returns its answer as
// is: the reply, or the leader's error status with its details. The call's
// deadline and cancellation reach the leader (a cancelled wait removes its
// queue entry there). A leader whose API does not accept the connection
// within forwardDialTimeout (or most of the call's deadline) is answered
// NOT_LEADER with the hint.
func (f *grpcForwarder) forward(ctx context.Context, api, method string, req any) (any, error) {
	rt, err := replyType(method)
	if err != nil {
		return nil, apiErr(codes.Internal, ReasonInternal, "forward to the leader: %v", err)
	}
	cc, done, err := f.conn(api)
	if err != nil {
		return nil, err
	}
	defer done()
	fctx, cancel := f.s.forwardContext(ctx)
	defer cancel()
	if !mayWait(req) {
		var c context.CancelFunc
		fctx, c = context.WithTimeout(fctx, f.s.forwardCap())
		defer c()
	}
	if err := awaitReady(fctx, cc); err != nil {
		return nil, f.callErr(ctx, api, err)
	}
	out := metadata.MD{}
	if in, ok := metadata.FromIncomingContext(ctx); ok {
		for k, v := range in {
			if passMetadata(k) {
				out[k] = v
			}
		}
	}
	out.Set(mdForwarded, "1")
	setOnBehalf(ctx, out) // the caller's identity, for the leader (auth.go)
	reply := rt.New().Interface()
	if err := cc.Invoke(metadata.NewOutgoingContext(fctx, out), method, req, reply); err != nil {
		return nil, f.callErr(ctx, api, err)
	}
	return reply, nil
}

// mayWait reports whether a call with req may wait for long on the leader
// by design: an acquisition with wait.
func mayWait(req any) bool {
	r, ok := req.(*dlockv1.AcquireRequest)
	return ok && r.GetWait()
}

// passMetadata reports whether an incoming metadata key is passed on to
// the leader: not the transport's own (pseudo-headers, content-type,
// user-agent, te, grpc-*), nor a forwarding mark or an identity
// (dlock-identity: see auth.go) the client sent.
func passMetadata(k string) bool {
	switch {
	case strings.HasPrefix(k, ":"), strings.HasPrefix(k, "grpc-"), k == mdForwarded, k == mdIdentity:
		return false
	case k == "content-type", k == "user-agent", k == "te":
		return false
	}
	return true
}

// callErr turns the failure of a forwarded call into this node's answer:
// the leader's own answer as is (its status and details); the client's
// cancellation or deadline as such; this node's shutdown as SHUTTING_DOWN;
// anything else (the leader's API did not answer, the connection broke)
// as NOT_LEADER with the hint.
func (f *grpcForwarder) callErr(ctx context.Context, api string, err error) error {
	select {
	case <-f.s.closing:
		return apiErr(codes.Unavailable, ReasonShuttingDown, "shutting down")
	default:
	}
	if ctx.Err() != nil {
		return ctxErr(ctx)
	}
	st, ok := status.FromError(err)
	if !ok {
		return f.s.unreachable(api, err)
	}
	switch st.Code() {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
		// The leader's own answers start with "dlockd:"; the transport's
		// (connection refused, reset, no answer in time) do not.
		if strings.HasPrefix(st.Message(), "dlockd:") {
			return st.Err()
		}
		return f.s.unreachable(api, errors.New(st.Message()))
	}
	return st.Err()
}

// awaitReady waits until cc is connected, within forwardDialTimeout and
// three quarters of ctx's time left. It fails at once when the last
// attempt to connect failed (the connection is in TRANSIENT_FAILURE,
// backing off), so that a leader that is down is reported without delay.
func awaitReady(ctx context.Context, cc *grpc.ClientConn) error {
	budget := forwardDialTimeout
	if dl, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(dl)*3/4)
	}
	wctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	for {
		st := cc.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			cc.Connect()
		case connectivity.TransientFailure:
			return errors.New("connection failed (retrying in the background)")
		case connectivity.Shutdown:
			return errors.New("connection closed")
		}
		if !cc.WaitForStateChange(wctx, st) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("not connected within %v", budget.Round(time.Millisecond))
		}
	}
}

// dialAddr is the address this node dials to reach addr, another member's
// API: addr itself, or its Config.RaftDialRewrite entry (tests put a proxy
// on every node-to-node link, so that a partition also cuts forwarding).
func (s *Server) dialAddr(addr string) string {
	if to, ok := s.cfg.RaftDialRewrite[addr]; ok {
		return to
	}
	return addr
}

// conn returns the cached connection to api, creating it, and a function
// to call when the forwarded call ends. Connections to other addresses
// (former leaders) are closed once no call uses them.
func (f *grpcForwarder) conn(api string) (*grpc.ClientConn, func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, nil, apiErr(codes.Unavailable, ReasonShuttingDown, "shutting down")
	}
	if !f.watched {
		f.watched = true
		go func() {
			<-f.s.stopCh
			f.close()
		}()
	}
	c := f.conns[api]
	if c == nil {
		cc, err := grpc.NewClient("passthrough:///"+f.s.dialAddr(api),
			grpc.WithTransportCredentials(f.s.memberGRPCCreds()),
			grpc.WithAuthority(api), // TLS verifies the leader as api, even through a dial rewrite
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: forwardDialTimeout,
			}),
			// A leader gone silent under a long forwarded wait is found
			// by pings (the leader permits one every 10s).
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second}),
			// The leader bounds its answers; this node relays them.
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)),
			grpc.WithUserAgent("dlockd-forward/"+f.s.cfg.NodeID),
		)
		if err != nil {
			return nil, nil, f.s.unreachable(api, err)
		}
		c = &fwdConn{cc: cc}
		f.conns[api] = c
	}
	for a, o := range f.conns {
		if a == api {
			continue
		}
		o.stale = true
		if o.inflight == 0 {
			delete(f.conns, a)
			go o.cc.Close()
		}
	}
	c.stale = false
	c.inflight++
	return c.cc, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		c.inflight--
		if c.inflight == 0 && c.stale && f.conns[api] == c {
			delete(f.conns, api)
			go c.cc.Close()
		}
	}, nil
}

// close closes every cached connection; later calls are refused.
func (f *grpcForwarder) close() {
	f.mu.Lock()
	f.closed = true
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for _, c := range conns {
		_ = c.cc.Close()
	}
}

// httpForwarder forwards the JSON API's requests of a node that is not the
// leader to the leader (or redirects them, with HeaderNoForward).
type httpForwarder struct {
	s    *Server
	mux  *http.ServeMux
	once sync.Once
	tr   *http.Transport
}

func newHTTPForwarder(s *Server, mux *http.ServeMux) *httpForwarder {
	return &httpForwarder{s: s, mux: mux}
}

// transport returns the HTTP transport to the leaders, and starts the
// goroutine that closes its idle connections when the server stops.
func (f *httpForwarder) transport() *http.Transport {
	f.once.Do(func() {
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: forwardDialTimeout, KeepAlive: 30 * time.Second}
			return d.DialContext(ctx, network, f.s.dialAddr(addr))
		}
		f.tr = &http.Transport{
			Proxy:       nil, // never through an environment proxy
			DialContext: dial,
			// nil without API TLS; the server name is the URL's host, the
			// certificates the current ones (re-read on SIGHUP).
			DialTLSContext:      f.s.memberDialTLS(dial),
			MaxIdleConns:        64,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		}
		go func() {
			<-f.s.stopCh
			f.tr.CloseIdleConnections()
		}()
	})
	return f.tr
}

// ServeHTTP serves r itself when this node is the leader, for routes
// outside /v1/ (health, readiness, metrics, pprof are never forwarded),
// for unknown routes, for /v1/cluster/ (the Cluster service forwards its
// own calls), and when forwardTo says so; otherwise it forwards r
// to the leader, or redirects it there (307) when r carries
// HeaderNoForward. A request already forwarded to this node is answered
// NOT_LEADER with this node's hint when it is not ready.
func (f *httpForwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.s.ready.Load() || !strings.HasPrefix(r.URL.Path, "/v1/") {
		f.mux.ServeHTTP(w, r)
		return
	}
	if _, pattern := f.mux.Handler(r); pattern == "" || strings.HasPrefix(r.URL.Path, "/v1/cluster/") {
		f.mux.ServeHTTP(w, r)
		return
	}
	if r.Header.Get(HeaderForwarded) != "" {
		if err := f.s.writable(); err != nil {
			start := time.Now()
			f.s.requestDone(transportHTTP, routeName(r.URL.Path), "", err, start)
			writeReply(w, nil, err)
			return
		}
		f.mux.ServeHTTP(w, r)
		return
	}
	api := f.s.forwardTo()
	if api == "" {
		f.mux.ServeHTTP(w, r)
		return
	}
	if r.Header.Get(HeaderNoForward) != "" {
		w.Header().Set(HeaderLeader, api)
		w.Header().Set("Location", f.s.apiScheme()+"://"+api+r.URL.RequestURI())
		w.WriteHeader(http.StatusTemporaryRedirect)
		return
	}
	f.forward(w, r, api)
}

// routeName is the metrics name of a JSON route: the path after /v1/,
// with dashes for slashes ("acquire", "cluster-status").
func routeName(path string) string {
	return strings.ReplaceAll(strings.TrimPrefix(path, "/v1/"), "/", "-")
}

// hopHeaders are the hop-by-hop headers a proxy does not pass on (RFC
// 9110, section 7.6.1), and Content-Length, which is set anew.
// Expect is dropped too: the body is read before forwarding.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Expect"}

// copyHeader copies the end-to-end headers of src into dst.
func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append([]string(nil), vs...)
	}
	for _, c := range src.Values("Connection") {
		for _, k := range strings.Split(c, ",") {
			dst.Del(strings.TrimSpace(k))
		}
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
}

// forward sends r to the leader's API at api and copies the answer back.
// The body is read first, within this node's limits (size, time); an
// acquisition with wait counts against this node's waiting requests while
// it runs. The client's disconnection cancels the leader's request.
func (f *httpForwarder) forward(w http.ResponseWriter, r *http.Request, api string) {
	start := time.Now()
	name := routeName(r.URL.Path)
	callPanicHook(r.Method + " " + r.URL.Path)
	var body []byte
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		b, code, berr := readBody(f.s, w, r)
		if berr != nil {
			f.s.requestDone(transportHTTP, name, "", berr, start)
			writeError(w, code, berr)
			return
		}
		body = b
	}
	if err := f.s.authorizeForward(r, body); err != nil { // checked before forwarding (auth.go)
		f.s.requestDone(transportHTTP, name, "", err, start)
		writeReply(w, nil, err)
		return
	}
	wait, key := false, ""
	if r.URL.Path == "/v1/acquire" {
		var ar dlockv1.AcquireRequest
		if jsonIn.Unmarshal(body, &ar) == nil {
			wait, key = ar.GetWait(), ar.GetKey()
		}
	}
	if wait {
		release, err := f.s.limits().takeWaiting()
		if err != nil {
			f.s.requestDone(transportHTTP, name, key, err, start)
			writeReply(w, nil, err)
			return
		}
		defer release()
	}
	ctx, cancel := f.s.forwardContext(r.Context())
	defer cancel()
	if !wait {
		var c context.CancelFunc
		ctx, c = context.WithTimeout(ctx, f.s.forwardCap())
		defer c()
	}
	out, err := http.NewRequestWithContext(ctx, r.Method, f.s.apiScheme()+"://"+api+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		err = apiErr(codes.Internal, ReasonInternal, "forward to the leader: %v", err)
		f.s.requestDone(transportHTTP, name, key, err, start)
		writeReply(w, nil, err)
		return
	}
	copyHeader(out.Header, r.Header)
	out.Header.Set(HeaderForwarded, "1")
	out.Header.Del(HeaderNoForward)
	setOnBehalfHeader(r.Context(), out.Header) // the caller's identity, for the leader (auth.go)
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := r.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			host = strings.Join(prior, ", ") + ", " + host
		}
		out.Header.Set("X-Forwarded-For", host)
	}
	resp, err := f.transport().RoundTrip(out)
	if err != nil {
		err = f.callErr(r.Context(), api, err)
		f.s.requestDone(transportHTTP, name, key, err, start)
		writeReply(w, nil, err)
		return
	}
	defer resp.Body.Close()
	copyHeader(w.Header(), resp.Header)
	if resp.StatusCode == http.StatusOK && !wait {
		w.WriteHeader(resp.StatusCode)
		_, cerr := io.Copy(w, resp.Body)
		f.s.requestDone(transportHTTP, name, key, f.copyErr(r.Context(), api, cerr), start)
		return
	}
	// Small answers read whole: errors (to count their code) and the
	// grant of a wait (to release it if it cannot be passed on).
	b, rerr := io.ReadAll(io.LimitReader(resp.Body, int64(f.s.cfg.MaxRequestBytes)+1<<20))
	if rerr != nil {
		rerr = f.callErr(r.Context(), api, rerr)
		f.s.requestDone(transportHTTP, name, key, rerr, start)
		writeReply(w, nil, rerr)
		return
	}
	w.WriteHeader(resp.StatusCode)
	_, werr := w.Write(b)
	if werr == nil {
		werr = http.NewResponseController(w).Flush()
	}
	if resp.StatusCode == http.StatusOK && werr != nil {
		f.undoGrant(api, b)
	}
	f.s.requestDone(transportHTTP, name, key, answerErr(resp.StatusCode, b), start)
}

// callErr is grpcForwarder.callErr for the HTTP transport's errors.
func (f *httpForwarder) callErr(ctx context.Context, api string, err error) error {
	select {
	case <-f.s.closing:
		return apiErr(codes.Unavailable, ReasonShuttingDown, "shutting down")
	default:
	}
	if ctx.Err() != nil {
		return ctxErr(ctx)
	}
	return f.s.unreachable(api, err)
}

// copyErr is the error counted for an answer whose body was cut: nil when
// it was copied whole.
func (f *httpForwarder) copyErr(ctx context.Context, api string, err error) error {
	if err == nil {
		return nil
	}
	return f.callErr(ctx, api, err)
}

// undoGrant releases the grant of a forwarded wait whose answer (body b)
// did not reach the client, as the leader does for its own clients: the
// key goes to the next waiter at once rather than after the claim window.
func (f *httpForwarder) undoGrant(api string, b []byte) {
	var g dlockv1.AcquireResponse
	if jsonIn.Unmarshal(b, &g) != nil || g.GetClaimWithin() == nil {
		return
	}
	req, _ := json.Marshal(map[string]string{"key": g.GetKey(), "owner": g.GetOwner()})
	ctx, cancel := context.WithTimeout(context.Background(), f.s.cfg.ApplyTimeout)
	defer cancel()
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, f.s.apiScheme()+"://"+api+"/v1/cancel-wait", bytes.NewReader(req))
	if err != nil {
		return
	}
	out.Header.Set("Content-Type", "application/json")
	out.Header.Set(HeaderForwarded, "1")
	if resp, err := f.transport().RoundTrip(out); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
}

// codesByName inverts codeName.
var codesByName = func() map[string]codes.Code {
	m := make(map[string]codes.Code)
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if n := codeName(c); n != "INTERNAL" || c == codes.Internal {
			m[n] = c
		}
	}
	return m
}()

// answerErr is the error counted for a forwarded answer of HTTP status
// code and body b: nil for a success, else an API error of the code the
// body names.
func answerErr(code int, b []byte) error {
	if code < 300 {
		return nil
	}
	var e struct {
		Code, Reason, Message string
	}
	_ = json.Unmarshal(b, &e)
	c, ok := codesByName[e.Code]
	if !ok {
		c = codes.Internal
	}
	msg := strings.TrimSuffix(strings.TrimPrefix(e.Message, "dlockd: "), " ("+e.Reason+")")
	return &apiError{code: c, reason: e.Reason, msg: msg}
}
