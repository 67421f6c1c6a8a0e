// Package tlserr says in words why a TLS connection to dlockd failed, for
// the dlockd driver's errors and the dlock CLI's messages: a client
// certificate the server refused (a TLS alert it sent), and a server
// certificate this client did not accept (a name it does not carry, an
// issuer it does not trust, an expiry). It reads Go's crypto/tls and
// crypto/x509 errors by type when it has them, and by their text when
// they arrive flattened (a gRPC status message, a wrapped url.Error).
package tlserr

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// remoteAlert is crypto/tls's text for an alert received from the peer.
const remoteAlert = "remote error: tls: "

// refusedAlerts are the TLS alerts (crypto/tls's texts) by which a server
// refuses the client's certificate, and what each means for the client.
var refusedAlerts = []struct{ alert, why string }{
	{"certificate required", "the server requires a client certificate and this client sent none (set cert=FILE and key=FILE; a Go client sends a certificate only when a CA the server names issued it)"},
	{"expired certificate", "this client's certificate has expired (or is not valid yet)"},
	{"unknown certificate authority", "this client's certificate is not issued by a CA the server trusts (its --tls-client-ca)"},
	{"revoked certificate", "this client's certificate was revoked"},
	{"unsupported certificate", "this client's certificate is of a kind the server does not accept"},
	{"unknown certificate", "the server did not accept this client's certificate"},
	{"bad certificate", "the server refused this client's certificate (not valid for client authentication, or not verifiable)"},
	{"access denied", "the server denied access to this client's certificate"},
}

// Refused reports whether msg (an error's text) carries a TLS alert by
// which the server refused this client's certificate; why says so in
// words, naming the alert.
func Refused(msg string) (why string, ok bool) {
	i := strings.Index(msg, remoteAlert)
	if i < 0 {
		return "", false
	}
	rest := msg[i+len(remoteAlert):]
	for _, a := range refusedAlerts {
		if strings.HasPrefix(rest, a.alert) {
			return fmt.Sprintf("%s (TLS alert %q)", a.why, a.alert), true
		}
	}
	return "", false
}

// ServerCert reports whether err says this client did not accept the
// server's certificate, and why in words: the name it checked (serverName
// when the client set one, else the dialled host) and the names the
// certificate carries; an issuer it does not trust; a certificate expired
// or not valid yet. serverName is "" when unknown.
func ServerCert(err error, serverName string) (why string, ok bool) {
	if err == nil {
		return "", false
	}
	var he x509.HostnameError
	if errors.As(err, &he) && he.Certificate != nil {
		return notNamed(he.Host, serverName, CertNames(he.Certificate)), true
	}
	var ua x509.UnknownAuthorityError
	if errors.As(err, &ua) {
		issuer := ""
		if ua.Cert != nil {
			issuer = fmt.Sprintf(" (issuer %q)", ua.Cert.Issuer.String())
		}
		return "the server's certificate is not trusted: it is not signed by a CA of the client's ca=FILE (or of the system roots without ca)" + issuer, true
	}
	var ci x509.CertificateInvalidError
	if errors.As(err, &ci) && ci.Reason == x509.Expired {
		return "the server's certificate has expired or is not valid yet (" + ci.Detail + ")", true
	}
	msg := err.Error()
	// Flattened: "x509: certificate is valid for A, B, not N".
	if i := strings.Index(msg, "x509: certificate is valid for "); i >= 0 {
		rest := msg[i+len("x509: certificate is valid for "):]
		if j := strings.LastIndex(rest, ", not "); j >= 0 {
			host := rest[j+len(", not "):]
			if k := strings.IndexAny(host, "\"); "); k >= 0 {
				host = host[:k]
			}
			return notNamed(host, serverName, strings.Split(rest[:j], ", ")), true
		}
	}
	switch {
	case strings.Contains(msg, "x509: certificate is not valid for any names"):
		return "the server's certificate names no host (no DNS or IP subject alternative name)", true
	case strings.Contains(msg, "x509: certificate signed by unknown authority"):
		return "the server's certificate is not trusted: it is not signed by a CA of the client's ca=FILE (or of the system roots without ca)", true
	case strings.Contains(msg, "x509: certificate has expired or is not yet valid"):
		return "the server's certificate has expired or is not valid yet", true
	}
	return "", false
}

// notNamed is the words of a server certificate that does not name host.
func notNamed(host, serverName string, names []string) string {
	checked := "the host dialled"
	if serverName != "" {
		checked = "server_name=" + serverName
	}
	return fmt.Sprintf("the server's certificate does not name %q (the name checked: %s); it names %s: set server_name to one of them, or give the server a certificate that names %q",
		host, checked, strings.Join(names, ", "), host)
}

// CertNames lists the names c is valid for: its DNS and IP subject
// alternative names, or its subject CN when it has none.
func CertNames(c *x509.Certificate) []string {
	var out []string
	out = append(out, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	if len(out) == 0 && c.Subject.CommonName != "" {
		out = append(out, c.Subject.CommonName+" (subject CN only, which Go does not match)")
	}
	return out
}
