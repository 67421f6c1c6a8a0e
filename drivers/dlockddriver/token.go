package dlockddriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"unicode"

	"google.golang.org/grpc/credentials"

	"github.com/dlock-dev/dlock/internal/urlparam"
)

// Bearer tokens (issue 12).
//
// A dlockd started with --auth-file authenticates every call. The Driver
// sends a token as "authorization: Bearer TOKEN" metadata on every RPC,
// the Session, Wait and Watch streams included (gRPC per-RPC
// credentials). The token comes from, in order:
//
//   - Options.Token, for a Driver made with Dial;
//   - the URL's token_file=FILE: Open reads FILE once (its trailing
//     newline trimmed); a missing, unreadable or empty file, or one of
//     more than one line, is an error matching driver.ErrInvalidArgument
//     naming the file (never the token);
//   - ContextWithToken on the context given to Open, for programs that
//     hold the token in memory (the dlock CLI's --token and DLOCK_TOKEN):
//     the token never goes into a URL that could be logged or printed.
//
// token_file and a context token together are an error. A token travels
// in clear on a plaintext connection: with the URL's tls (Options.TLS),
// the credentials require TLS; without it, Open refuses a token for a
// member whose host is not a loopback address (127.0.0.0/8, ::1,
// localhost), and every call checks it again for members learned from
// leader hints, so a token is never sent in clear over a network.
//
// A call dlockd refuses answers PERMISSION_DENIED (the token's identity
// lacks the permission on the key) or UNAUTHENTICATED (no token, or one
// the server does not know): both map to driver.ErrPermissionDenied,
// never to driver.ErrUnavailable (retrying cannot help).

// maxTokenBytes bounds a token file.
const maxTokenBytes = 4096

// tokenKey is the context key of ContextWithToken.
type tokenKey struct{}

// ContextWithToken returns ctx carrying a bearer token for Open (and
// dlock.Open of a dlockd:// URL) to use, so that a program can pass a token
// it holds in memory without writing it into the URL. Only Open reads it;
// calls of the opened Driver send the token whatever their context.
func ContextWithToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, tokenKey{}, token)
}

func tokenFromContext(ctx context.Context) string {
	t, _ := ctx.Value(tokenKey{}).(string)
	return t
}

// Token returns the bearer token a Driver opened with u and ctx sends: the
// URL's token_file (read now), or ContextWithToken's; "" for none. Both
// is an error, and so is a token file Open would refuse: all match
// driver.ErrInvalidArgument and never quote the token. The dlock CLI uses
// it for its HTTP calls to dlockd.
func Token(ctx context.Context, u *url.URL) (string, error) {
	q := u.Query()
	if q.Has("token_file") {
		if tokenFromContext(ctx) != "" {
			return "", urlparam.Invalid("dlockd: two tokens: the URL's token_file and the caller's (the dlock CLI's --token, DLOCK_TOKEN or config token): keep one")
		}
		return readTokenFile(q.Get("token_file"))
	}
	t := tokenFromContext(ctx)
	if t == "" {
		return "", nil
	}
	if err := checkToken(t); err != nil {
		return "", urlparam.Invalid("dlockd: token: %v", err)
	}
	return t, nil
}

// readTokenFile reads a token from path: the whole file, its trailing
// newline (\n or \r\n) trimmed.
func readTokenFile(path string) (string, error) {
	if path == "" {
		return "", urlparam.Invalid("dlockd: URL parameter token_file is empty: want the path of a file holding the token")
	}
	f, err := os.Open(path)
	if err != nil {
		return "", urlparam.Invalid("dlockd: token_file: %v", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
	if err != nil {
		return "", urlparam.Invalid("dlockd: token_file %s: %v", path, err)
	}
	if len(b) > maxTokenBytes {
		return "", urlparam.Invalid("dlockd: token_file %s: larger than %d bytes: not a token file", path, maxTokenBytes)
	}
	tok := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if err := checkToken(tok); err != nil {
		return "", urlparam.Invalid("dlockd: token_file %s: %v", path, err)
	}
	return tok, nil
}

// checkToken refuses an empty token and one with spaces or control
// characters (a file of two lines, a token pasted with its name). The
// error never quotes the token.
func checkToken(tok string) error {
	if tok == "" {
		return errors.New("empty: want the token (dlock token new prints one)")
	}
	for i, r := range tok {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r > unicode.MaxASCII {
			return fmt.Errorf("the token has a space, control or non-ASCII character at byte %d (one token on one line, nothing else)", i)
		}
	}
	return nil
}

// bearer is the per-RPC credentials of a token.
type bearer struct {
	token      string
	requireTLS bool // the URL asked for TLS: never send the token without it
}

// GetRequestMetadata implements credentials.PerRPCCredentials: the
// authorization metadata, refused on a plaintext connection to a host that
// is not a loopback address.
func (b bearer) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	if !b.requireTLS {
		ri, _ := credentials.RequestInfoFromContext(ctx)
		if credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity) != nil {
			host := ""
			if len(uri) > 0 {
				if u, err := url.Parse(uri[0]); err == nil {
					host = u.Host
				}
			}
			if !loopbackAddr(host) {
				return nil, fmt.Errorf("dlockd: not sending the token in clear to %s: add tls=1 to the URL", host)
			}
		}
	}
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (b bearer) RequireTransportSecurity() bool { return b.requireTLS }

// loopbackAddr reports whether host[:port] names a loopback address.
func loopbackAddr(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// checkTokenTransport refuses a token over plaintext to a member that is
// not on loopback.
func checkTokenTransport(addrs []string, opts *Options) error {
	if opts.Token == "" || opts.TLS != nil {
		return nil
	}
	for _, a := range addrs {
		if !loopbackAddr(a) {
			return urlparam.Invalid("dlockd: a token would travel in clear to %s: add tls=1 (and ca=FILE) to the URL, or use a loopback address", a)
		}
	}
	return nil
}
