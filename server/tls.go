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
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
)

// apiHandshakeTimeout bounds the TLS handshake of one API connection (and
// the read of its first bytes, as on a plaintext port).
const apiHandshakeTimeout = 10 * time.Second

// apiTLS is the TLS state of the API port: what it serves (swapped whole
// by reloadTLS) and what members present and trust when they dial each
// other's APIs.
type apiTLS struct {
	certFile, keyFile, clientCAFile string

	// srv is the configuration of the next handshake: the certificate,
	// the client CA pool (client CAs and the peer CA) and the client
	// authentication mode. Swapped by load.
	srv atomic.Pointer[tls.Config]
	// base is what the mux hands to tls.Server: it returns srv's current
	// value for every handshake.
	base *tls.Config
	// reloadMu serializes reloads.
	reloadMu sync.Mutex

	// peerCAs are the peer CA's certificates (Config.PeerCAFile), nil
	// when peer TLS is off; peerRoots their DER, to tell a member's
	// verified chain (see memberCert).
	peerCAs   *x509.CertPool
	peerCerts []*x509.Certificate
	peerRoots map[string]bool

	// memberRoots verify other members' API certificates (TLSCAFile, else
	// PeerCAFile; nil: the system roots); memberCert is this node's peer
	// certificate, presented as client certificate on those dials (nil
	// without peer TLS).
	memberRoots *x509.CertPool
	memberCert  *tls.Certificate
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

// newAPITLS reads the TLS files of cfg: the API certificate and key, the
// client CA, the members' CA and this node's peer certificate. It returns
// nil (and no error) when the API has no TLS; an error names the file it
// could not read or parse.
func newAPITLS(cfg Config) (*apiTLS, error) {
	if cfg.TLSCertFile == "" {
		return nil, nil
	}
	a := &apiTLS{certFile: cfg.TLSCertFile, keyFile: cfg.TLSKeyFile, clientCAFile: cfg.TLSClientCAFile}
	if cfg.PeerCAFile != "" {
		certs, err := readCerts("peer CA (--peer-ca)", cfg.PeerCAFile)
		if err != nil {
			return nil, err
		}
		a.peerCAs, a.peerCerts = x509.NewCertPool(), certs
		a.peerRoots = make(map[string]bool, len(certs))
		for _, c := range certs {
			a.peerCAs.AddCert(c)
			a.peerRoots[string(c.Raw)] = true
		}
		a.memberRoots = a.peerCAs
	}
	if cfg.TLSCAFile != "" {
		certs, err := readCerts("members' API CA (--tls-ca)", cfg.TLSCAFile)
		if err != nil {
			return nil, err
		}
		a.memberRoots = x509.NewCertPool()
		for _, c := range certs {
			a.memberRoots.AddCert(c)
		}
	}
	if cfg.PeerCertFile != "" {
		pair, err := tls.LoadX509KeyPair(cfg.PeerCertFile, cfg.PeerKeyFile)
		if err != nil {
			return nil, fmt.Errorf("dlockd: peer certificate %s / key %s (--peer-cert, --peer-key): %w", cfg.PeerCertFile, cfg.PeerKeyFile, err)
		}
		a.memberCert = &pair
	}
	if err := a.load(); err != nil {
		return nil, err
	}
	a.base = &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return a.srv.Load(), nil
		},
	}
	return a, nil
}

// load reads the API certificate, key and client CA and makes them the
// configuration of the next handshakes. On error the current
// configuration stays.
func (a *apiTLS) load() error {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	if _, err := readCerts("API certificate (--tls-cert)", a.certFile); err != nil {
		return err
	}
	pair, err := tls.LoadX509KeyPair(a.certFile, a.keyFile)
	if err != nil {
		return fmt.Errorf("dlockd: API key %s does not go with certificate %s (--tls-key, --tls-cert), or does not parse: %w", a.keyFile, a.certFile, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		// The server picks by its own order: http/1.1 for a client that
		// offers both (browsers, curl), h2 for one that offers only h2
		// (gRPC).
		NextProtos: []string{"http/1.1", "h2"},
	}
	switch {
	case a.clientCAFile != "":
		certs, err := readCerts("client CA (--tls-client-ca)", a.clientCAFile)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		for _, c := range certs {
			pool.AddCert(c)
		}
		for _, c := range a.peerCerts {
			pool.AddCert(c)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	case a.peerCAs != nil:
		// Members present their peer certificate; anyone else may
		// present none.
		cfg.ClientCAs = a.peerCAs
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	default:
		cfg.ClientAuth = tls.NoClientCert
	}
	a.srv.Store(cfg)
	return nil
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

// tlsStateKey is the context key of an HTTP connection's TLS state.
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

// memberCert reports whether st carries a client certificate that
// verified against the peer CA (Config.PeerCAFile): the caller is a
// cluster member. nodeID is the certificate's subject CN ("" if none). It
// is false for nil st, a plaintext port, and a certificate that verified
// against the client CA (--tls-client-ca) only. A peer CA that is also the
// client CA makes every client with a certificate a member.
func (s *Server) memberCert(st *tls.ConnectionState) (nodeID string, ok bool) {
	if st == nil || s.tls == nil || len(s.tls.peerRoots) == 0 {
		return "", false
	}
	for _, chain := range st.VerifiedChains {
		if len(chain) == 0 {
			continue
		}
		if s.tls.peerRoots[string(chain[len(chain)-1].Raw)] {
			return chain[0].Subject.CommonName, true
		}
	}
	return "", false
}

// memberTLSConfig returns the TLS configuration this node dials other
// members' APIs with, or nil when the API has no TLS: their certificate
// must verify against Config.TLSCAFile (default PeerCAFile; neither: the
// system roots) for serverName, and this node presents its peer
// certificate as client certificate. serverName "" leaves it to the
// caller (grpc-go and net/http take the dialled address's host).
func (s *Server) memberTLSConfig(serverName string) *tls.Config {
	if s.tls == nil {
		return nil
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    s.tls.memberRoots,
		ServerName: serverName,
	}
	if s.tls.memberCert != nil {
		cfg.Certificates = []tls.Certificate{*s.tls.memberCert}
	}
	return cfg
}

// memberGRPCCreds returns the gRPC transport credentials this node dials
// other members' APIs with: TLS as memberTLSConfig says, the server name
// being the dial's authority (a dial through Config.RaftDialRewrite sets
// grpc.WithAuthority to the member's real address), or insecure
// credentials when the API has no TLS.
func (s *Server) memberGRPCCreds() credentials.TransportCredentials {
	if cfg := s.memberTLSConfig(""); cfg != nil {
		return credentials.NewTLS(cfg)
	}
	return insecure.NewCredentials()
}

// apiScheme is the scheme of this node's API URLs, and other members':
// "https" when the API serves TLS, else "http".
func (s *Server) apiScheme() string {
	if s.tls != nil {
		return "https"
	}
	return "http"
}

// reloadTLS re-reads the API certificate, key and client CA; the next
// handshakes use them (open connections keep theirs). On error (a file
// missing or not parsing, a key that does not go with the certificate)
// the current ones stay and the error names the file. Without API TLS it
// does nothing.
func (s *Server) reloadTLS() error {
	if s.tls == nil {
		return nil
	}
	return s.tls.load()
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
