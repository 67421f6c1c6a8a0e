package server

// This file owns TLS on the API port (issue 12): loading and reloading the
// API certificate, key and client CA; the server side of the handshake
// (the TLS configuration the connection mux hands to tls.Server, and the
// gRPC transport credentials and HTTP connection context that pass the
// handshake's state to the handlers); and the client side members use to
// dial each other's APIs (forwarded calls, joins, status probes). It
// touches nothing else of the server.
//
// One port serves gRPC and JSON over HTTP: the mux runs the TLS handshake
// first, then sniffs the decrypted bytes as it does on a plaintext port
// (an HTTP/2 preface goes to gRPC, anything else to the HTTP server). ALPN
// offers "http/1.1" before "h2": the server picks by its own order, so a
// gRPC client (which offers only h2) gets h2, and a browser or curl (which
// offer both) gets HTTP/1.1 and reaches the HTTP server.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// apiHandshakeTimeout bounds the TLS handshake of one API connection (and
// the read of its first bytes, as on a plaintext port).
const apiHandshakeTimeout = 10 * time.Second

// The security model of the API port's certificates.
//
// Three CAs can be configured, and they must not be mixed up:
//
//   - --tls-cert/--tls-key: the API port's own certificate, verified by
//     clients (and by other members against --tls-ca, default --peer-ca).
//   - --peer-ca: the members' CA. A client certificate that verifies
//     against it is a cluster member's (memberCert) when its CN or a DNS
//     SAN is a node ID of the current Raft configuration: a member may
//     do everything, and may name the identity a forwarded call acts for.
//     A peer CA's certificate that names no member is not a member; it is
//     accepted for one call only, a node's own AddVoter (join, or a
//     registration) naming its CN as the node ID, because a joining node
//     is not in the configuration yet. The peer CA is therefore the
//     cluster's membership authority: a certificate it signs may join the
//     cluster under its CN (as it may speak on the Raft port), so it must
//     be issued to cluster nodes only.
//   - --tls-client-ca: the CA of client (identity) certificates, mapped to
//     identities by the auth file. Client and identity certificates must
//     never be issued by the peer CA: a client holding one could join the
//     cluster under its CN. dlockd warns at start when --tls-client-ca
//     names a certificate of --peer-ca.

// tlsMaterial is what the TLS files hold, read together and swapped whole
// by a reload (reloadTLS): a failed read keeps the previous material.
type tlsMaterial struct {
	// srv is the API port's handshake configuration (nil without API
	// TLS): the certificate, the client CA pool (client CA and peer CA)
	// and ClientAuth. Client certificates are verified when given;
	// requireClientCert says a call without one is refused (per call:
	// requireClientCertUnary, requireClientCertHTTP), so the public
	// routes stay reachable without one.
	srv               *tls.Config
	requireClientCert bool

	// peerCert is this node's peer certificate (Config.PeerCertFile),
	// presented on the Raft port and as client certificate on API dials
	// to other members; peerCAs and peerRoots (DER of each) are
	// Config.PeerCAFile's. All nil without peer TLS.
	peerCert  *tls.Certificate
	peerCAs   *x509.CertPool
	peerRoots map[string]bool
	// raft is the Raft port's mutual TLS configuration (nil without
	// peer TLS).
	raft *tls.Config

	// memberRoots verify other members' API certificates (TLSCAFile,
	// else PeerCAFile; nil: the system roots).
	memberRoots *x509.CertPool

	// clientCAIsPeerCA: a certificate of TLSClientCAFile is one of
	// PeerCAFile (warned at start).
	clientCAIsPeerCA bool
}

// apiTLS is the TLS state of the API port: the current material, the
// configuration the mux hands to tls.Server (it takes the material's for
// every handshake), and the AddVoter calls in flight (see memberCert).
type apiTLS struct {
	cur  atomic.Pointer[tlsMaterial]
	base *tls.Config
	// reloadMu serializes reloads.
	reloadMu sync.Mutex
	// joins maps the TLS state of an AddVoter call in flight (a copy
	// made for the call, see requireClientCertUnary) to the node ID the
	// request names.
	joins sync.Map // *tls.ConnectionState -> string
}

// validateTLS checks the API TLS settings and the rule of a non-loopback
// Listen (called by Validate). Files are read at Start.
func (c Config) validateTLS() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("dlockd: config: "+format, a...)) }
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		bad("API TLS needs both TLSCertFile and TLSKeyFile (--tls-cert, --tls-key), or neither")
	}
	on := c.TLSCertFile != "" && c.TLSKeyFile != ""
	if c.TLSClientCAFile != "" && !on {
		bad("TLSClientCAFile (--tls-client-ca) needs TLSCertFile and TLSKeyFile (--tls-cert, --tls-key): client certificates are asked for in the TLS handshake")
	}
	if c.TLSCAFile != "" && !on {
		bad("TLSCAFile (--tls-ca) needs TLSCertFile and TLSKeyFile (--tls-cert, --tls-key): members dial each other's API over TLS only when it serves TLS")
	}
	clustered := c.Join != "" || len(c.InitialCluster) > 1
	if c.TLSClientCAFile != "" && clustered && c.PeerCertFile == "" {
		bad("TLSClientCAFile (--tls-client-ca) in a cluster needs peer TLS (--peer-cert, --peer-key, --peer-ca): members present their peer certificate to each other's API")
	}
	if host, _, err := net.SplitHostPort(c.Listen); err == nil && host != "" && !on && !c.InsecureListen && !loopbackHost(host) {
		bad("Listen %q is not a loopback address: serve the API over TLS (--tls-cert, --tls-key), bind to 127.0.0.1, or pass --insecure-listen to serve it in clear to the network", c.Listen)
	}
	return errs
}

// readTLSMaterial reads every TLS file of cfg: the API certificate, key
// and client CA (when API TLS is on), the peer certificate, key and CA
// (when peer TLS is on) and the members' API CA. The error names the file
// it could not read or parse, and matches ErrConfig.
func readTLSMaterial(cfg Config) (*tlsMaterial, error) {
	m, err := readTLSFiles(cfg)
	return m, configErr(err)
}

func readTLSFiles(cfg Config) (*tlsMaterial, error) {
	m := &tlsMaterial{}
	var peerCerts []*x509.Certificate
	if cfg.PeerCertFile != "" {
		pair, err := tls.LoadX509KeyPair(cfg.PeerCertFile, cfg.PeerKeyFile)
		if err != nil {
			return nil, fmt.Errorf("dlockd: peer certificate %s / key %s (--peer-cert, --peer-key): %w", cfg.PeerCertFile, cfg.PeerKeyFile, err)
		}
		m.peerCert = &pair
	}
	if cfg.PeerCAFile != "" {
		var err error
		if peerCerts, err = readCerts("peer CA (--peer-ca)", cfg.PeerCAFile); err != nil {
			return nil, err
		}
		m.peerCAs = x509.NewCertPool()
		m.peerRoots = make(map[string]bool, len(peerCerts))
		for _, c := range peerCerts {
			m.peerCAs.AddCert(c)
			m.peerRoots[string(c.Raw)] = true
		}
		m.memberRoots = m.peerCAs
	}
	if m.peerCert != nil && m.peerCAs != nil {
		m.raft = &tls.Config{
			Certificates: []tls.Certificate{*m.peerCert},
			RootCAs:      m.peerCAs,
			ClientCAs:    m.peerCAs,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS13,
		}
	}
	if cfg.TLSCertFile == "" {
		return m, nil
	}
	if cfg.TLSCAFile != "" {
		certs, err := readCerts("members' API CA (--tls-ca)", cfg.TLSCAFile)
		if err != nil {
			return nil, err
		}
		m.memberRoots = x509.NewCertPool()
		for _, c := range certs {
			m.memberRoots.AddCert(c)
		}
	}
	if _, err := readCerts("API certificate (--tls-cert)", cfg.TLSCertFile); err != nil {
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("dlockd: API key %s does not go with certificate %s (--tls-key, --tls-cert), or does not parse: %w", cfg.TLSKeyFile, cfg.TLSCertFile, err)
	}
	m.srv = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		// The server picks by its own order: http/1.1 for a client that
		// offers both (browsers, curl), h2 for one that offers only h2
		// (gRPC).
		NextProtos: []string{"http/1.1", "h2"},
	}
	switch {
	case cfg.TLSClientCAFile != "":
		certs, err := readCerts("client CA (--tls-client-ca)", cfg.TLSClientCAFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		for _, c := range certs {
			pool.AddCert(c)
			if m.peerRoots[string(c.Raw)] {
				m.clientCAIsPeerCA = true
			}
		}
		for _, c := range peerCerts {
			pool.AddCert(c)
		}
		// Verified when given; required per call, not in the handshake,
		// so that /healthz, /readyz, /metrics and the dashboard's static
		// files answer a client without one (health checks, Prometheus).
		m.srv.ClientCAs = pool
		m.srv.ClientAuth = tls.VerifyClientCertIfGiven
		m.requireClientCert = true
	case m.peerCAs != nil:
		// Members present their peer certificate; anyone else may
		// present none.
		m.srv.ClientCAs = m.peerCAs
		m.srv.ClientAuth = tls.VerifyClientCertIfGiven
	default:
		m.srv.ClientAuth = tls.NoClientCert
	}
	return m, nil
}

// newAPITLS reads the TLS files of cfg (readTLSMaterial) and returns the
// API port's TLS state, or nil (and no error) when the API has no TLS. It
// logs a warning on log when the client CA is (or contains) the peer CA.
// An error names the file and matches ErrConfig.
func newAPITLS(cfg Config, log *slog.Logger) (*apiTLS, error) {
	if cfg.TLSCertFile == "" {
		return nil, nil
	}
	m, err := readTLSMaterial(cfg)
	if err != nil {
		return nil, err
	}
	a := &apiTLS{}
	a.cur.Store(m)
	a.base = &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return a.cur.Load().srv, nil
		},
	}
	if m.clientCAIsPeerCA && log != nil {
		log.Warn("dlockd: --tls-client-ca names a certificate of --peer-ca: client certificates are then issued by the members' CA, and one whose CN is a node ID is a cluster member (every permission, and may act for any identity), one whose CN is not may join the cluster under it; issue client and identity certificates from another CA",
			"tls_client_ca", cfg.TLSClientCAFile, "peer_ca", cfg.PeerCAFile)
	}
	return a, nil
}

// readCerts reads the PEM certificates of file; what names the file's
// role in errors.
func readCerts(what, file string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("dlockd: %s: %w", what, err)
	}
	var out []*x509.Certificate
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("dlockd: %s %s: %w", what, file, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("dlockd: %s %s: no PEM certificate in it", what, file)
	}
	return out, nil
}

// tlsStateKey is the context key of an HTTP connection's TLS state (and
// of an AddVoter call's copy of it, see requireClientCertUnary).
type tlsStateKey struct{}

// tlsStateFromContext returns the caller's TLS state (its verified chains
// included) for a gRPC handler's or interceptor's context, or for an HTTP
// request's r.Context(); nil on a plaintext connection.
func tlsStateFromContext(ctx context.Context) *tls.ConnectionState {
	if st, ok := ctx.Value(tlsStateKey{}).(*tls.ConnectionState); ok {
		return st
	}
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			return &info.State
		}
	}
	return nil
}

// httpConnContext is the API's http.Server.ConnContext: it puts the
// connection's TLS state in every request's context (net/http's r.TLS
// stays nil: the mux hands it a wrapped connection).
func (s *Server) httpConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc := tlsConnOf(c); tc != nil {
		st := tc.ConnectionState()
		return context.WithValue(ctx, tlsStateKey{}, &st)
	}
	return ctx
}

// tlsConnOf returns the TLS connection under c (a connection of the mux),
// or nil.
func tlsConnOf(c net.Conn) *tls.Conn {
	switch v := c.(type) {
	case *tls.Conn:
		return v
	case *prefixConn:
		tc, _ := v.Conn.(*tls.Conn)
		return tc
	}
	return nil
}

// memberCert reports whether st carries the client certificate of a
// cluster member: one whose verified chain ends at a certificate of the
// peer CA (Config.PeerCAFile, as last read) AND whose subject CN or a DNS
// SAN is a node ID of the current Raft configuration. nodeID is that ID.
// During an AddVoter call whose request names node ID X (a node joining,
// or registering: it is not in the configuration yet, see
// requireClientCertUnary), a peer CA certificate with CN X counts as
// member X for that call only. It is false for nil st, a plaintext port, a
// certificate that verified against the client CA (--tls-client-ca) only,
// and a peer CA certificate that names no member (see "The security
// model" above).
func (s *Server) memberCert(st *tls.ConnectionState) (nodeID string, ok bool) {
	if st == nil || s.tls == nil {
		return "", false
	}
	m := s.tls.cur.Load()
	if len(m.peerRoots) == 0 {
		return "", false
	}
	for _, chain := range st.VerifiedChains {
		if len(chain) == 0 || !m.peerRoots[string(chain[len(chain)-1].Raw)] {
			continue
		}
		leaf := chain[0]
		if id, ok := s.configMember(leaf); ok {
			return id, true
		}
		if id, ok := s.tls.joins.Load(st); ok && leaf.Subject.CommonName != "" && id.(string) == leaf.Subject.CommonName {
			return leaf.Subject.CommonName, true
		}
	}
	return "", false
}

// configMember returns the node ID of the current Raft configuration that
// leaf names as subject CN or DNS SAN, if any.
func (s *Server) configMember(leaf *x509.Certificate) (string, bool) {
	if !s.raftUp.Load() {
		return "", false
	}
	conf, err := s.raftConfiguration()
	if err != nil {
		return "", false
	}
	for _, srv := range conf.Servers {
		id := string(srv.ID)
		if id != "" && (leaf.Subject.CommonName == id || slices.Contains(leaf.DNSNames, id)) {
			return id, true
		}
	}
	return "", false
}

// memberTLSConfig returns the TLS configuration this node dials other
// members' APIs with, or nil when the API has no TLS: their certificate
// must verify against Config.TLSCAFile (default PeerCAFile; neither: the
// system roots) for serverName, and this node presents its peer
// certificate as client certificate. Both come from the files as last
// (re)loaded: call it for each new connection (memberGRPCCreds and
// memberDialTLS do). serverName "" leaves it to the caller (grpc-go and
// net/http take the dialled address's host).
func (s *Server) memberTLSConfig(serverName string) *tls.Config {
	if s.tls == nil {
		return nil
	}
	m := s.tls.cur.Load()
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    m.memberRoots,
		ServerName: serverName,
	}
	if m.peerCert != nil {
		cfg.Certificates = []tls.Certificate{*m.peerCert}
	}
	return cfg
}

// memberGRPCCreds returns the gRPC transport credentials this node dials
// other members' APIs with: TLS as memberTLSConfig says, built afresh for
// every handshake (so a reload's certificate and CA apply to the next
// connection of a long-lived client), the server name being the dial's
// authority (a dial through Config.RaftDialRewrite sets grpc.WithAuthority
// to the member's real address); insecure credentials when the API has no
// TLS.
func (s *Server) memberGRPCCreds() credentials.TransportCredentials {
	if s.tls == nil {
		return insecure.NewCredentials()
	}
	return memberCreds{s: s}
}

// memberCreds are memberGRPCCreds with API TLS: grpc-go's TLS credentials
// over the current memberTLSConfig, made for each handshake. Full
// verification (chain and server name) is crypto/tls's own.
type memberCreds struct{ s *Server }

func (c memberCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.s.memberTLSConfig("")).ClientHandshake(ctx, authority, conn)
}

func (memberCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("dlockd: the members' client credentials cannot serve")
}

func (memberCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2"}
}

func (c memberCreds) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is deprecated in grpc-go; the authority names the
// server.
func (memberCreds) OverrideServerName(string) error { return nil }

// memberDialTLS returns the DialTLSContext of an http.Transport to other
// members' APIs (nil without API TLS): dial (the transport's TCP dial,
// rewrite included), then the TLS handshake with memberTLSConfig for
// addr's host, read afresh for each connection.
func (s *Server) memberDialTLS(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if s.tls == nil {
		return nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(c, s.memberTLSConfig(host))
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = c.Close()
			return nil, err
		}
		return tc, nil
	}
}

// apiScheme is the scheme of this node's API URLs, and other members':
// "https" when the API serves TLS, else "http".
func (s *Server) apiScheme() string {
	if s.tls != nil {
		return "https"
	}
	return "http"
}

// reloadTLS re-reads every TLS file: the API certificate, key and client
// CA, the peer certificate, key and CA, and the members' API CA (--tls-ca).
// The next handshakes use them, on the API port and the Raft port, and
// for this node's own dials to other members (Raft, forwarded calls,
// joins, status probes); open connections keep theirs. On error (a file
// missing or not parsing, a key that does not go with its certificate)
// everything stays as it was and the error names the file. Without TLS
// it does nothing.
func (s *Server) reloadTLS() error {
	if s.tls == nil && (s.stream == nil || s.stream.tlsConfig() == nil) {
		return nil
	}
	var mu *sync.Mutex
	if s.tls != nil {
		mu = &s.tls.reloadMu
	} else {
		mu = &s.stream.reloadMu
	}
	mu.Lock()
	defer mu.Unlock()
	m, err := readTLSMaterial(s.cfg)
	if err != nil {
		s.log.Error("dlockd: TLS files not reloaded; the certificates in force stay", "err", err)
		return err
	}
	if s.tls != nil {
		s.tls.cur.Store(m)
	}
	if s.stream != nil && m.raft != nil {
		s.stream.setTLS(m.raft)
	}
	s.log.Info("dlockd: TLS files reloaded")
	return nil
}

// Client certificates per call (--tls-client-ca).

// errClientCertRequired is the answer to a call without a verified client
// certificate when Config.TLSClientCAFile is set.
func errClientCertRequired() *apiError {
	return &apiError{code: codes.Unauthenticated, reason: ReasonUnauthenticated,
		msg: "a client certificate is required (--tls-client-ca): present one issued by the server's client CA (a dlockd URL's cert=FILE and key=FILE)"}
}

// clientCertMissing reports whether the caller of ctx must be refused for
// want of a verified client certificate.
func (s *Server) clientCertMissing(ctx context.Context) bool {
	if s.tls == nil || !s.tls.cur.Load().requireClientCert {
		return false
	}
	st := tlsStateFromContext(ctx)
	return st == nil || len(st.VerifiedChains) == 0
}

// requireClientCertUnary is the gRPC unary interceptor of the API's TLS
// (before authentication): with Config.TLSClientCAFile, a call without a
// verified client certificate is refused, UNAUTHENTICATED. It also marks
// an AddVoter call for memberCert: the call's TLS state is copied, and
// the copy is registered with the node ID the request names for the
// call's duration, so that a node not yet in the configuration can join
// (or learn that it was removed) with its peer certificate.
func (s *Server) requireClientCertUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if s.tls == nil {
		return h(ctx, req)
	}
	if s.clientCertMissing(ctx) {
		err := errClientCertRequired()
		s.audit(ctx, "deny", "", err.msg, err)
		return nil, err
	}
	if r, ok := req.(*dlockv1.AddVoterRequest); ok && info.FullMethod == dlockv1.Cluster_AddVoter_FullMethodName && r.GetId() != "" {
		if st := tlsStateFromContext(ctx); st != nil && len(st.VerifiedChains) > 0 {
			cp := *st
			s.tls.joins.Store(&cp, r.GetId())
			defer s.tls.joins.Delete(&cp)
			ctx = context.WithValue(ctx, tlsStateKey{}, &cp)
		}
	}
	return h(ctx, req)
}

// requireClientCertStream is requireClientCertUnary for streams.
func (s *Server) requireClientCertStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if s.clientCertMissing(ss.Context()) {
		err := errClientCertRequired()
		s.audit(ss.Context(), "deny", "", err.msg, err)
		return err
	}
	return h(srv, ss)
}

// requireClientCertHTTP is the HTTP middleware of the API's TLS (before
// authentication): with Config.TLSClientCAFile, every route but the public
// ones (/healthz, /readyz, /metrics, the dashboard's static files:
// publicPath) answers 401 without a verified client certificate.
func (s *Server) requireClientCertHTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !publicPath(r.URL.Path) && s.clientCertMissing(r.Context()) {
			err := errClientCertRequired()
			s.audit(withOperation(withRemote(r.Context(), r.RemoteAddr), r.Method+" "+r.URL.Path), "deny", "", err.msg, err)
			_ = writeReply(w, nil, err)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Handshake failures on the API port.

// Values of the reason label of dlockd_tls_handshake_failures_total.
const (
	tlsFailClientCert = "client_cert" // the client's certificate was refused: expired, unknown CA, ...
	tlsFailProtocol   = "protocol"    // not TLS (plaintext), or no common version, cipher or ALPN; or the client refused the server's certificate
	tlsFailTimeout    = "timeout"     // no handshake within apiHandshakeTimeout
	tlsFailOther      = "other"       // the client closed or reset the connection, ...
)

// initTLSMetrics registers dlockd_tls_handshake_failures_total{reason}
// (every reason at 0). New calls it.
func (s *Server) initTLSMetrics() {
	s.tlsFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dlockd_tls_handshake_failures_total",
		Help: "TLS handshakes that failed on the API port, by reason: client_cert (the client's certificate was refused), protocol (not TLS, no common version, cipher or protocol, or the client refused the server's certificate), timeout, other.",
	}, []string{"reason"})
	for _, r := range []string{tlsFailClientCert, tlsFailProtocol, tlsFailTimeout, tlsFailOther} {
		s.tlsFailures.WithLabelValues(r)
	}
	s.metrics.reg.MustRegister(s.tlsFailures)
}

// tlsFailReason classifies a server handshake error.
func tlsFailReason(err error) string {
	var rh tls.RecordHeaderError
	var cv *tls.CertificateVerificationError
	var ne net.Error
	msg := err.Error()
	switch {
	case errors.As(err, &cv), strings.Contains(msg, "client didn't provide a certificate"):
		return tlsFailClientCert
	case errors.As(err, &ne) && ne.Timeout():
		return tlsFailTimeout
	case errors.As(err, &rh), strings.Contains(msg, "remote error: tls:"),
		strings.HasPrefix(msg, "tls: ") && !strings.Contains(msg, "tls: failed to") && !errors.Is(err, io.EOF):
		return tlsFailProtocol
	}
	return tlsFailOther
}

// tlsHandshakeFailed counts and logs (at info, at most one line per
// logEvery, see limits.go) a failed handshake on the API port. It returns
// the failure's reason.
func (s *Server) tlsHandshakeFailed(remote net.Addr, err error) string {
	reason := tlsFailReason(err)
	if s.tlsFailures != nil {
		s.tlsFailures.WithLabelValues(reason).Inc()
	}
	if suppressed, ok := s.lim.logTurn("tls_handshake"); ok {
		s.log.Info("dlockd: TLS handshake failed", "remote", remote.String(), "reason", reason, "err", err, "suppressed", suppressed)
	}
	return reason
}

// apiCreds are the gRPC server's transport credentials: the mux has done
// the TLS handshake already (when the port serves TLS), so ServerHandshake
// only reports the connection's TLS state (peer.FromContext then carries a
// credentials.TLSInfo). A plaintext connection gets no AuthInfo, as
// without credentials.
type apiCreds struct{}

func (apiCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc := tlsConnOf(c)
	if tc == nil {
		return c, nil, nil
	}
	return c, credentials.TLSInfo{
		State:          tc.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
	}, nil
}

func (apiCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("dlockd: the API's server credentials cannot dial")
}

func (apiCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (c apiCreds) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is deprecated in grpc-go and unused by servers.
func (apiCreds) OverrideServerName(string) error { return nil }

// The plaintext hint: a client that speaks plaintext to a TLS port gets a
// word of why, instead of a connection closed without a reason.

// tlsRequiredMsg is the text a plaintext client of a TLS port is sent.
const tlsRequiredMsg = "dlockd: this port serves TLS only: use https://, or tls=1 in a dlockd:// URL"

// answerPlaintext writes a short refusal on c, whose first bytes (hdr,
// read as a TLS record header) are plaintext: an HTTP/1.x request gets a
// 400 (as net/http answers on its TLS ports). Anything else gets nothing:
// an HTTP/2 client (gRPC) sees the connection closed before the server
// preface, and fails at once (a server preface and a GOAWAY with a reason
// made grpc-go reconnect until the call's deadline instead, without
// showing the reason), which the dlockd driver explains with a hint at
// tls=1. It then drains what the client sent, briefly, so that closing
// does not reset the connection before the client reads the answer.
func answerPlaintext(c net.Conn, hdr []byte) {
	if !looksLikeHTTP(hdr) {
		return
	}
	out := []byte("HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n" + tlsRequiredMsg + "\n")
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(out); err != nil {
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// looksLikeHTTP reports whether hdr starts like an HTTP/1.x request line.
func looksLikeHTTP(hdr []byte) bool {
	for _, m := range []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ", "CONNECT "} {
		if bytes.HasPrefix([]byte(m), hdr) || bytes.HasPrefix(hdr, []byte(m)) {
			return true
		}
	}
	return false
}
