package dlockddriver

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc/credentials"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/tlserr"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// tlsParams are the URL parameters TLSConfig reads.
var tlsParams = []string{"tls", "ca", "cert", "key", "server_name"}

// TLSConfig returns the client TLS configuration that the query of the
// dlockd URL u asks for, or nil (and no error) when it asks for none:
//
//   - tls=1 (or true): dial every member over TLS, verifying its
//     certificate against the system roots for the member's host; tls=0
//     (or false): plaintext, the default.
//   - ca=FILE: verify against the CA certificate(s) in FILE (PEM) instead.
//   - cert=FILE and key=FILE: present this client certificate and key
//     (PEM) to a dlockd started with --tls-client-ca. Both or neither.
//   - server_name=NAME: verify every member's certificate for NAME instead
//     of its host (an address the certificate does not name, e.g. an IP).
//
// ca, cert and key imply tls=1; server_name needs TLS. The files are read
// here, so that a wrong path or a file that does not parse is reported at
// Open. Every error matches driver.ErrInvalidArgument and names the
// parameter and the file. The CLI's HTTP calls to dlockd use the same
// configuration.
func TLSConfig(u *url.URL) (*tls.Config, error) {
	cfg, _, err := tlsConfig(u)
	return cfg, err
}

// tlsConfig is TLSConfig, and also returns an ID of the configuration: a
// SHA-256 of server_name and of the bytes of the files it parsed, so that
// two URLs whose configurations are the same (the same files, unchanged)
// have the same ID and their Drivers may share connections (connshare.go).
// "" with a nil configuration.
func tlsConfig(u *url.URL) (*tls.Config, string, error) {
	q := u.Query()
	on := false
	explicit := false
	switch v := q.Get("tls"); strings.ToLower(v) {
	case "":
	case "1", "true":
		on, explicit = true, true
	case "0", "false":
		explicit = true
	default:
		return nil, "", urlparam.Invalid("dlockd: URL parameter tls=%q: want 1, true, 0 or false", v)
	}
	ca, cert, key, name := q.Get("ca"), q.Get("cert"), q.Get("key"), q.Get("server_name")
	if ca != "" || cert != "" || key != "" {
		if explicit && !on {
			return nil, "", urlparam.Invalid("dlockd: URL parameters ca, cert and key need TLS, but the URL says tls=%s", q.Get("tls"))
		}
		on = true
	}
	if !on {
		if name != "" {
			return nil, "", urlparam.Invalid("dlockd: URL parameter server_name=%q needs TLS (add tls=1)", name)
		}
		return nil, "", nil
	}
	if (cert == "") != (key == "") {
		return nil, "", urlparam.Invalid("dlockd: URL parameters cert and key go together: give both (a client certificate and its key) or neither")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	id := sha256.New()
	part := func(label string, b []byte) {
		fmt.Fprintf(id, "%s %d\n", label, len(b))
		id.Write(b)
	}
	part("server_name", []byte(name))
	if ca != "" {
		pool, caPEM, err := readCAFile(ca)
		if err != nil {
			return nil, "", err
		}
		cfg.RootCAs = pool
		part("ca", caPEM)
	}
	if cert != "" {
		var files [2][]byte
		for i, p := range [][2]string{{"cert", cert}, {"key", key}} {
			b, err := os.ReadFile(p[1])
			if err != nil {
				return nil, "", urlparam.Invalid("dlockd: URL parameter %s=%q: %v", p[0], p[1], errors.Unwrap(err))
			}
			files[i] = b
		}
		pair, err := tls.X509KeyPair(files[0], files[1])
		if err != nil {
			return nil, "", urlparam.Invalid("dlockd: URL parameters cert=%q and key=%q: not a PEM certificate and its private key: %v", cert, key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		part("cert", files[0])
		part("key", files[1])
	}
	return cfg, hex.EncodeToString(id.Sum(nil)), nil
}

// readCAFile reads the PEM certificates of the ca parameter's file, and
// returns the file's bytes too.
func readCAFile(file string) (*x509.CertPool, []byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, urlparam.Invalid("dlockd: URL parameter ca=%q: %v", file, errors.Unwrap(err))
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, nil, urlparam.Invalid("dlockd: URL parameter ca=%q: %v", file, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, nil, urlparam.Invalid("dlockd: URL parameter ca=%q: no PEM certificate in the file", file)
	}
	return pool, b, nil
}

// tlsNotServed is crypto/tls's error text for a TLS client answered by a
// plaintext server.
const tlsNotServed = "first record does not look like a TLS handshake"

// tlsHint returns a hint for a connection failure whose text suggests a
// plaintext Driver refused by dlockd's TLS port: the connection closed
// before the HTTP/2 server preface (dlockd closes a plaintext connection
// to its TLS port without a word). "" for any other text.
func tlsHint(msg string) string {
	if strings.Contains(msg, "server preface") && !strings.Contains(msg, "tls:") {
		return "; if the server's port serves TLS, add tls=1 (and ca=FILE) to the dlockd URL"
	}
	return ""
}

// serverCertWords starts tlserr.ServerCert's explanations.
const serverCertWords = "the server's certificate "

// explainingCreds are the Driver's TLS credentials: a failed handshake
// whose cause is the server's certificate (a name it does not carry, an
// untrusted issuer, an expiry) is explained in words (tlserr.ServerCert),
// with the name checked: serverName (the URL's server_name) or the host
// dialled. Verification itself is crypto/tls's, unchanged.
type explainingCreds struct {
	credentials.TransportCredentials
	serverName string
}

func (c explainingCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	nc, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, conn)
	if err != nil {
		if why, ok := tlserr.ServerCert(err, c.serverName); ok {
			return nil, nil, fmt.Errorf("%s (%w)", why, err)
		}
	}
	return nc, info, err
}

func (c explainingCreds) Clone() credentials.TransportCredentials {
	return explainingCreds{TransportCredentials: c.TransportCredentials.Clone(), serverName: c.serverName}
}

// tlsErr maps a connection error's text (msg, a gRPC status message) to
// the Driver's error for op when it is about TLS: a client certificate the
// server refused (its TLS alert) is driver.ErrPermissionDenied naming the
// cause; a server certificate this Driver did not accept is a plain error
// (driver.ErrUnavailable at the root) saying why, without gRPC's wrapping.
// nil for anything else.
func tlsErr(op, msg string) error {
	// grpc-go quotes the transport's error: connection error: desc = "...".
	if i := strings.Index(msg, `desc = "`); i >= 0 {
		if u, err := strconv.Unquote(msg[i+len("desc = "):]); err == nil {
			msg = u
		}
	}
	if why, ok := tlserr.Refused(msg); ok {
		return fmt.Errorf("%w: dlockd refused this client's certificate in the TLS handshake: %s", driver.ErrPermissionDenied, why)
	}
	if i := strings.Index(msg, serverCertWords); i >= 0 {
		return fmt.Errorf("dlockd %s: TLS: %s", op, msg[i:])
	}
	if why, ok := tlserr.ServerCert(errors.New(msg), ""); ok {
		return fmt.Errorf("dlockd %s: TLS: %s (%s)", op, why, msg)
	}
	return nil
}
