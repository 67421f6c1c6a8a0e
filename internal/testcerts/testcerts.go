// Package testcerts makes certificate authorities and leaf certificates for
// tests (crypto/x509, ECDSA P-256), written to files in the test's
// temporary directories. It imports nothing of dlock, so that any package's
// tests (internal ones of package server included) can use it;
// server/servertest re-exports it.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// CA is a certificate authority made by a test (ECDSA P-256), valid from an
// hour ago to a day from now. Its certificate is written to CertFile (PEM)
// in a temporary directory of the test.
type CA struct {
	// Cert is the CA's certificate; Key its private key.
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is Cert in PEM; CertFile the file holding it.
	PEM      []byte
	CertFile string
	// Pool is a pool holding Cert alone (a client's RootCAs).
	Pool *x509.CertPool

	dir string
}

// Leaf is a certificate and key issued by a CA, written to CertFile and
// KeyFile (PEM) in the test's temporary directory.
type Leaf struct {
	// Cert is the parsed certificate; Pair the tls.Certificate of it and
	// its key (for tls.Config.Certificates).
	Cert *x509.Certificate
	Pair tls.Certificate
	// CertPEM and KeyPEM are the certificate and the key (EC PRIVATE KEY)
	// in PEM; CertFile and KeyFile the files holding them.
	CertPEM, KeyPEM   []byte
	CertFile, KeyFile string
}

// LeafOptions shape a leaf certificate (see CA.IssueWith). The zero value
// is what CA.Issue makes.
type LeafOptions struct {
	// DNSNames and IPs are the subject alternative names. Both empty:
	// "localhost", 127.0.0.1 and ::1.
	DNSNames []string
	IPs      []net.IP
	// NotBefore and NotAfter bound the validity. Zero: an hour ago, and a
	// day from now.
	NotBefore, NotAfter time.Time
	// ServerOnly and ClientOnly restrict the extended key usage to TLS
	// server or client authentication. Neither: both.
	ServerOnly, ClientOnly bool
}

var fileSafe = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// NewCA makes a CA whose subject CN is name, and writes its certificate to
// a file. It fails the test on error.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcerts: CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcerts: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcerts: CA certificate: %v", err)
	}
	ca := &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Pool: x509.NewCertPool(), dir: t.TempDir()}
	ca.Pool.AddCert(cert)
	ca.CertFile = writeFile(t, ca.dir, fileSafe.ReplaceAllString(name, "_")+"-ca.pem", ca.PEM)
	return ca
}

// Issue issues a leaf certificate with subject CN cn for localhost,
// 127.0.0.1 and ::1, usable as TLS server and client certificate, valid
// from an hour ago to a day from now. It fails the test on error.
func (ca *CA) Issue(t testing.TB, cn string) *Leaf {
	t.Helper()
	return ca.IssueWith(t, cn, LeafOptions{})
}

// IssueWith issues a leaf certificate with subject CN cn shaped by o (an
// expired one, one for other names, ...). Each call writes new files. It
// fails the test on error.
func (ca *CA) IssueWith(t testing.TB, cn string, o LeafOptions) *Leaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcerts: leaf key: %v", err)
	}
	if len(o.DNSNames) == 0 && len(o.IPs) == 0 {
		o.DNSNames = []string{"localhost"}
		o.IPs = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	eku := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	switch {
	case o.ServerOnly:
		eku = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	case o.ClientOnly:
		eku = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: cn},
		NotBefore: o.NotBefore, NotAfter: o.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: eku,
		DNSNames: o.DNSNames, IPAddresses: o.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatalf("testcerts: leaf certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcerts: leaf certificate: %v", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("testcerts: leaf key: %v", err)
	}
	l := &Leaf{
		Cert:    cert,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
	if l.Pair, err = tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
		t.Fatalf("testcerts: leaf key pair: %v", err)
	}
	base := fileSafe.ReplaceAllString(cn, "_") + "-" + cert.SerialNumber.Text(16)
	l.CertFile = writeFile(t, ca.dir, base+".pem", l.CertPEM)
	l.KeyFile = writeFile(t, ca.dir, base+"-key.pem", l.KeyPEM)
	return l
}

// ClientTLS returns a client configuration that trusts ca and presents
// the leaf certificates given (none: no client certificate).
func (ca *CA) ClientTLS(leaves ...*Leaf) *tls.Config {
	cfg := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}
	for _, l := range leaves {
		cfg.Certificates = append(cfg.Certificates, l.Pair)
	}
	return cfg
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("testcerts: serial: %v", err)
	}
	return n
}

func writeFile(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatalf("testcerts: %v", err)
	}
	return p
}
