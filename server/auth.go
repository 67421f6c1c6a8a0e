package server

// Authentication and authorisation (issue 12): who a caller is, and what it
// may do on which keys. This file owns the auth file (Config.AuthFile), the
// identities it defines, the gRPC interceptors and the HTTP middleware that
// attach the caller's identity to its context, and the checks the handlers
// call (authorize, allowed, authorizeRequest). It touches nothing else: the
// audit log is audit.go's, TLS and the member certificates are tls.go's.
//
// # The auth file
//
// YAML, or JSON when its first character (after blanks) is "{". It lists
// identities; each has a name (shown in logs and audit lines, never a
// secret), credentials, and rules of key prefix to permissions:
//
//	identities:
//	  - name: payout-worker
//	    token_sha256: 9c56cc51b374c3ba189210d5b6d4bf57790d351c96c47c02190ecf1e430635ab
//	    rules:
//	      "payout:": [lock]
//	  - name: ops
//	    token_sha256: [<hash of the current token>, <hash of the next one>]
//	    cert_cn: [ops.example.com]     # client certificate subject CN
//	    cert_dns: [ops.internal]       # or a DNS SAN
//	    rules:
//	      "": [admin, lock]
//
// token_sha256, cert_cn and cert_dns take one string or a list. A token is
// stored only as the lower-case hex SHA-256 of its bytes (see package
// internal/authtoken for why SHA-256 rather than a password hash: tokens
// are random 256-bit values); make one with "dlock token new NAME", which
// prints the token once and the entry to paste. A name, a token hash, a
// CN and a DNS name each belong to one identity. Unknown fields, unknown
// permissions, malformed hashes and duplicates are errors naming the line
// (YAML) or the identity (JSON).
//
// # Permissions
//
//   - lock: Acquire, Wait, Renew, Release, CancelWait, and every call of a
//     Session stream, on keys under the prefix.
//   - read: Inspect, List (results filtered to the keys the identity may
//     read; a list of a prefix under which it may read nothing is denied),
//     CheckFence, the dashboard's data, and the cluster's status (read on
//     the prefix "").
//   - admin: ForceRelease on keys under the prefix; on the prefix "" also
//     cluster membership (add, remove, transfer leadership) and
//     /debug/pprof.
//
// admin implies read (an operator who may force a key free must see who
// holds it), and nothing else: it does not imply lock. The prefix "" is
// every key. A key is under a prefix when it starts with it, byte for byte.
//
// Watch streams push the loss of a session's leases: any authenticated
// identity may open one, and it receives only the events of keys it may
// lock or read (a lock-only client learns of its own leases' loss).
//
// # Who the caller is
//
// A call's credentials are, in order: a bearer token (gRPC metadata
// "authorization", HTTP header "Authorization", both "Bearer TOKEN"); a
// client certificate verified against the cluster's peer CA (another
// member: every permission, or the identity it names in dlock-identity /
// Dlock-Identity when it forwards a client's call); a verified client
// certificate whose subject CN or a DNS SAN an identity lists. None of
// these, or an unknown token or certificate, is UNAUTHENTICATED (HTTP 401);
// a known identity without the permission is PERMISSION_DENIED (HTTP 403),
// naming the key and the missing permission. Both are written to the audit
// log. /healthz, /readyz, /metrics and the dashboard's static files need
// no credentials.
//
// A follower checks a call before it forwards it to the leader, and the
// leader checks it again: a token travels with the call; an identity
// proven by a certificate is named by the forwarding member (the leader
// trusts a member's word, as it trusts its Raft log).
//
// # Reload
//
// Reload (ReloadAs("signal:SIGHUP") in dlockd: the audit line's identity)
// reads the file again. A file that does not parse leaves the rules in
// force, logs an error and audits "auth-reload" with result "failed"; the
// TLS files' reload is audited "tls-reload" the same way. Calls in flight
// finish under the rules they started with.
//
// # Lists
//
// A list (List, /v1/list, the dashboard's keys) scans only the key ranges
// under its prefix that the caller may read (readRanges): the pages, and
// the page tokens that name their last key, never name a key it may not
// read, and a page token the client makes up only moves the start of the
// scan within those ranges. Without Config.AuthFile nothing here runs: no
// identity is attached and every call is allowed, as before issue 12.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Permission is what an identity may do on the keys under a prefix: PermLock
// (acquire, wait, renew, release, cancel a wait), PermRead (inspect, list,
// watch, check a fence, the cluster's status) or PermAdmin (force release;
// on the prefix "", cluster membership and profiling). PermAdmin implies
// PermRead.
type Permission uint8

// The permissions of an auth file's rules.
const (
	PermLock Permission = iota + 1
	PermRead
	PermAdmin
)

// String returns "lock", "read" or "admin".
func (p Permission) String() string {
	switch p {
	case PermLock:
		return "lock"
	case PermRead:
		return "read"
	case PermAdmin:
		return "admin"
	}
	return "permission(" + strconv.Itoa(int(p)) + ")"
}

// permSet is a set of permissions, one bit each.
type permSet uint8

func (p Permission) bit() permSet { return 1 << p }

// has reports whether the set grants p; admin implies read.
func (ps permSet) has(p Permission) bool {
	if ps&p.bit() != 0 {
		return true
	}
	return p == PermRead && ps&PermAdmin.bit() != 0
}

// Reasons of authentication and authorisation refusals.
const (
	// ReasonUnauthenticated: no credentials, or an unknown token or
	// certificate (gRPC UNAUTHENTICATED, HTTP 401).
	ReasonUnauthenticated = "UNAUTHENTICATED"
	// ReasonPermissionDenied: the identity lacks the permission on the key
	// (gRPC PERMISSION_DENIED, HTTP 403).
	ReasonPermissionDenied = "PERMISSION_DENIED"
)

// The wire names of identities.
const (
	// MetaAuthorization is the gRPC metadata key of a bearer token:
	// "authorization: Bearer TOKEN" (HTTP: the Authorization header).
	MetaAuthorization = "authorization"
	// HeaderIdentity names, on a call a member forwards, the identity the
	// member acts for (gRPC metadata key in lower case). It is trusted only
	// from a caller whose certificate verifies against the peer CA, and a
	// member never passes on a client's own.
	HeaderIdentity = "Dlock-Identity"
)

// mdIdentity is HeaderIdentity as a gRPC metadata key.
const mdIdentity = "dlock-identity"

// maxAuthFileBytes bounds the auth file.
const maxAuthFileBytes = 16 << 20

// rule grants perms on the keys under prefix.
type rule struct {
	prefix string
	perms  permSet
}

// identity is who a caller is: a name and its rules, or a member. The
// identity of a call also records the rules it was found in and the
// credential that proved it, so that a long-lived stream is checked
// against the rules in force after a Reload (see fresh).
type identity struct {
	name   string
	rules  []rule
	member bool   // another member (peer certificate): every permission
	via    string // the member (node ID) that forwarded the call, or ""

	ar       *authRules         // the rules it was found in (nil: a member)
	tokenSum *[sha256.Size]byte // proven by this token
	leaf     *x509.Certificate  // or by this client certificate (else by name: forwarded)
}

// bound returns a copy of id (an entry of ar) for one caller, recording
// its credential.
func (id *identity) bound(ar *authRules, sum *[sha256.Size]byte, leaf *x509.Certificate) *identity {
	return &identity{name: id.name, rules: id.rules, ar: ar, tokenSum: sum, leaf: leaf}
}

// fresh returns id as the rules in force see it: id itself when they are
// the rules it was found in (or it is a member's), the identity its
// credential proves now after a Reload, or nil when its credential was
// revoked.
func (s *Server) fresh(id *identity) *identity {
	cur := s.auth.rules.Load()
	if id == nil || id.member || cur == nil || id.ar == cur {
		return id
	}
	var n *identity
	switch {
	case id.tokenSum != nil:
		n = cur.byToken(*id.tokenSum)
	case id.leaf != nil:
		n = cur.byCert(id.leaf)
	default:
		n = cur.byName[id.name]
	}
	if n == nil {
		return nil
	}
	b := n.bound(cur, id.tokenSum, id.leaf)
	b.via = id.via
	return b
}

// can reports whether id has p on key.
func (id *identity) can(p Permission, key string) bool {
	if id.member {
		return true
	}
	for _, r := range id.rules {
		if r.perms.has(p) && strings.HasPrefix(key, r.prefix) {
			return true
		}
	}
	return false
}

// canUnder reports whether id has p on some key under prefix: a rule's
// prefix is a prefix of it (every key under it), or starts with it (some).
func (id *identity) canUnder(p Permission, prefix string) bool {
	if id.member {
		return true
	}
	for _, r := range id.rules {
		if r.perms.has(p) && (strings.HasPrefix(prefix, r.prefix) || strings.HasPrefix(r.prefix, prefix)) {
			return true
		}
	}
	return false
}

// authRules is one reading of the auth file.
type authRules struct {
	file   string
	byName map[string]*identity
	tokens []tokenEntry
	cn     map[string]*identity
	dns    map[string]*identity
}

type tokenEntry struct {
	hash [sha256.Size]byte
	id   *identity
}

// byToken returns the identity whose token hashes to sum, comparing with
// every entry in constant time (no early exit), or nil.
func (ar *authRules) byToken(sum [sha256.Size]byte) *identity {
	var found *identity
	for i := range ar.tokens {
		if subtle.ConstantTimeCompare(ar.tokens[i].hash[:], sum[:]) == 1 {
			found = ar.tokens[i].id
		}
	}
	return found
}

// byCert returns the identity whose cert_cn is leaf's subject CN or whose
// cert_dns is one of its DNS SANs, or nil.
func (ar *authRules) byCert(leaf *x509.Certificate) *identity {
	if cn := leaf.Subject.CommonName; cn != "" {
		if id := ar.cn[cn]; id != nil {
			return id
		}
	}
	for _, d := range leaf.DNSNames {
		if id := ar.dns[strings.ToLower(d)]; id != nil {
			return id
		}
	}
	return nil
}

// authState is the server's authentication state: the rules in force (nil
// without Config.AuthFile) and the audit log.
type authState struct {
	rules atomic.Pointer[authRules]
	audit *auditLog
}

// enabled reports whether calls are authenticated.
func (s *Server) authEnabled() bool { return s.auth.rules.Load() != nil }

// loadAuth reads Config.AuthFile at Start: an error refuses to start.
func (s *Server) loadAuth() error {
	if s.cfg.AuthFile == "" {
		return nil
	}
	ar, err := readAuthFile(s.cfg.AuthFile)
	if err != nil {
		return err
	}
	s.auth.rules.Store(ar)
	s.log.Info("dlockd: auth file loaded", "file", s.cfg.AuthFile, "identities", len(ar.byName))
	return nil
}

// Reload is ReloadAs("operator"): the reload of a program that embeds the
// server. dlockd calls ReloadAs("signal:SIGHUP") on SIGHUP.
func (s *Server) Reload() error { return s.ReloadAs("operator") }

// ReloadAs reads Config.AuthFile again and, through reloadTLS, the TLS
// files; who names what asked for it in the audit log's identity field
// ("signal:SIGHUP" in dlockd). An auth file that fails to read or parse
// keeps the rules in force: the error is logged, audited (action
// "auth-reload", result "failed", the error as reason) and returned. When
// TLS is configured, its reload is audited too (action "tls-reload": "ok",
// or "failed" with the reason; the certificates in force then stay).
// Without AuthFile only the TLS files are read. It returns every error
// joined.
func (s *Server) ReloadAs(who string) error {
	ctx := withIdentity(context.Background(), &identity{name: who})
	var errs []error
	if s.cfg.AuthFile != "" {
		ar, err := readAuthFile(s.cfg.AuthFile)
		if err != nil {
			s.log.Error("dlockd: auth file not reloaded; the rules in force stay", "file", s.cfg.AuthFile, "err", err)
			s.audit(ctx, "auth-reload", "", err.Error(), err)
			errs = append(errs, err)
		} else {
			s.auth.rules.Store(ar)
			s.log.Info("dlockd: auth file reloaded", "file", s.cfg.AuthFile, "identities", len(ar.byName))
			s.audit(ctx, "auth-reload", "", fmt.Sprintf("%d identities", len(ar.byName)), nil)
		}
	}
	tlsOn := s.cfg.TLSCertFile != "" || s.cfg.PeerCertFile != ""
	if err := s.reloadTLS(); err != nil {
		s.audit(ctx, "tls-reload", "", err.Error(), err)
		errs = append(errs, err)
	} else if tlsOn {
		s.audit(ctx, "tls-reload", "", "certificates re-read", nil)
	}
	return errors.Join(errs...)
}

// authFileErr is the error of a bad auth file: its path, where, what.
func authFileErr(file, where, format string, a ...any) error {
	if where != "" {
		where += ": "
	}
	return fmt.Errorf("dlockd: auth file %s: %s%s", file, where, fmt.Sprintf(format, a...))
}

// fileIdentity is one identity as the file writes it.
type fileIdentity struct {
	Name        string             `json:"name" yaml:"name"`
	TokenSHA256 strList            `json:"token_sha256" yaml:"token_sha256"`
	CertCN      strList            `json:"cert_cn" yaml:"cert_cn"`
	CertDNS     strList            `json:"cert_dns" yaml:"cert_dns"`
	Rules       map[string]strList `json:"rules" yaml:"rules"`
	where       string             // "line N" (YAML) or "identities[i]" (JSON)
	ruleLines   map[string]int     // YAML: the line of each rule
}

var fileIdentityFields = []string{"name", "token_sha256", "cert_cn", "cert_dns", "rules"}

// strList is a string or a list of strings.
type strList []string

func (l *strList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = strList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("want a string or a list of strings")
	}
	*l = many
	return nil
}

func (l *strList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*l = strList{n.Value}
		return nil
	case yaml.SequenceNode:
		out := make(strList, 0, len(n.Content))
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: want a string", c.Line)
			}
			out = append(out, c.Value)
		}
		*l = out
		return nil
	}
	return fmt.Errorf("line %d: want a string or a list of strings", n.Line)
}

// UnmarshalYAML decodes one identity, refusing unknown fields, and records
// its line and the lines of its rules.
func (fi *fileIdentity) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: an identity is a mapping (name, token_sha256, cert_cn, cert_dns, rules)", n.Line)
	}
	fi.where = "line " + strconv.Itoa(n.Line)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !slices.Contains(fileIdentityFields, k.Value) {
			return fmt.Errorf("line %d: unknown field %q in an identity (want %s)", k.Line, k.Value, strings.Join(fileIdentityFields, ", "))
		}
		if k.Value == "rules" && v.Kind == yaml.MappingNode {
			fi.ruleLines = make(map[string]int)
			for j := 0; j+1 < len(v.Content); j += 2 {
				fi.ruleLines[v.Content[j].Value] = v.Content[j].Line
			}
		}
	}
	type plain fileIdentity // no UnmarshalYAML: no recursion
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	p.where, p.ruleLines = fi.where, fi.ruleLines
	*fi = fileIdentity(p)
	return nil
}

type authFileDoc struct {
	Identities []fileIdentity `json:"identities" yaml:"identities"`
}

// readAuthFile reads and checks the auth file at path.
func readAuthFile(path string) (*authRules, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("dlockd: auth file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxAuthFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("dlockd: auth file %s: %w", path, err)
	}
	if len(b) > maxAuthFileBytes {
		return nil, authFileErr(path, "", "larger than %d bytes", maxAuthFileBytes)
	}
	return parseAuthFile(path, b)
}

// parseAuthFile parses an auth file's content b (path names it in errors).
func parseAuthFile(path string, b []byte) (*authRules, error) {
	var doc authFileDoc
	trimmed := bytes.TrimLeft(b, " \t\r\n\ufeff")
	if len(trimmed) == 0 {
		return nil, authFileErr(path, "", "empty: want a list of identities (see dlockd's auth file documentation, or dlock token new)")
	}
	if trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&doc); err != nil {
			return nil, authFileErr(path, jsonWhere(b, dec, err), "invalid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
		if dec.More() {
			return nil, authFileErr(path, "", "invalid JSON: more than one value")
		}
		for i := range doc.Identities {
			doc.Identities[i].where = fmt.Sprintf("identities[%d]", i)
		}
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&doc); err != nil {
			return nil, authFileErr(path, "", "invalid YAML: %s", yamlErr(err))
		}
	}
	return buildRules(path, doc.Identities)
}

// yamlTypeName matches the Go type names yaml.v3 puts in its errors.
var yamlTypeName = regexp.MustCompile(` (in type|into) [*\[\]]*server\.[A-Za-z]+`)

// yamlTopField matches yaml.v3's complaint about an unknown top-level key.
var yamlTopField = regexp.MustCompile(`field (\S+) not found in type server\.authFileDoc`)

// yamlErr is a YAML decoding error on one line, without Go type names.
func yamlErr(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msg = strings.Join(te.Errors, "; ")
	}
	msg = yamlTopField.ReplaceAllString(msg, `unknown field "$1" (want identities)`)
	msg = yamlTypeName.ReplaceAllString(msg, "")
	return strings.ReplaceAll(msg, "\n", "; ")
}

// jsonWhere names the line of a JSON decoding error, when it has an
// offset.
func jsonWhere(b []byte, dec *json.Decoder, err error) string {
	off := int64(-1)
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	default:
		off = dec.InputOffset()
	}
	if off < 0 || off > int64(len(b)) {
		return ""
	}
	return "line " + strconv.Itoa(1+bytes.Count(b[:off], []byte{'\n'}))
}

// buildRules checks the identities of a file and indexes them.
func buildRules(path string, ids []fileIdentity) (*authRules, error) {
	ar := &authRules{file: path, byName: make(map[string]*identity), cn: make(map[string]*identity), dns: make(map[string]*identity)}
	if len(ids) == 0 {
		return nil, authFileErr(path, "", "no identities: want \"identities:\" with at least one entry (see dlock token new)")
	}
	hashes := make(map[[sha256.Size]byte]string)
	for _, fi := range ids {
		where := fi.where
		if err := checkIdentityName(fi.Name); err != nil {
			return nil, authFileErr(path, where, "identity name %q: %v", fi.Name, err)
		}
		if _, dup := ar.byName[fi.Name]; dup {
			return nil, authFileErr(path, where, "identity %q is defined twice", fi.Name)
		}
		if len(fi.TokenSHA256)+len(fi.CertCN)+len(fi.CertDNS) == 0 {
			return nil, authFileErr(path, where, "identity %q has no token_sha256, cert_cn or cert_dns: nobody could be it", fi.Name)
		}
		id := &identity{name: fi.Name}
		for _, h := range fi.TokenSHA256 {
			raw, err := hex.DecodeString(strings.ToLower(strings.TrimSpace(h)))
			if err != nil || len(raw) != sha256.Size {
				return nil, authFileErr(path, where, "identity %q: token_sha256 %q is not 64 hex digits (the SHA-256 of a token: dlock token hash prints it; never put the token itself here)", fi.Name, shorten(h))
			}
			var sum [sha256.Size]byte
			copy(sum[:], raw)
			if other, dup := hashes[sum]; dup {
				return nil, authFileErr(path, where, "identity %q: a token_sha256 is already identity %q's", fi.Name, other)
			}
			hashes[sum] = fi.Name
			ar.tokens = append(ar.tokens, tokenEntry{hash: sum, id: id})
		}
		for _, c := range fi.CertCN {
			if c == "" {
				return nil, authFileErr(path, where, "identity %q: empty cert_cn", fi.Name)
			}
			if other := ar.cn[c]; other != nil {
				return nil, authFileErr(path, where, "identity %q: cert_cn %q is already identity %q's", fi.Name, c, other.name)
			}
			ar.cn[c] = id
		}
		for _, d := range fi.CertDNS {
			d = strings.ToLower(d)
			if d == "" {
				return nil, authFileErr(path, where, "identity %q: empty cert_dns", fi.Name)
			}
			if other := ar.dns[d]; other != nil {
				return nil, authFileErr(path, where, "identity %q: cert_dns %q is already identity %q's", fi.Name, d, other.name)
			}
			ar.dns[d] = id
		}
		prefixes := make([]string, 0, len(fi.Rules))
		for p := range fi.Rules {
			prefixes = append(prefixes, p)
		}
		slices.Sort(prefixes)
		for _, p := range prefixes {
			rw := where
			if l, ok := fi.ruleLines[p]; ok {
				rw = "line " + strconv.Itoa(l)
			}
			if !utf8.ValidString(p) {
				return nil, authFileErr(path, rw, "identity %q: rule prefix %q is not valid UTF-8", fi.Name, p)
			}
			var ps permSet
			for _, name := range fi.Rules[p] {
				perm, ok := parsePermission(name)
				if !ok {
					return nil, authFileErr(path, rw, "identity %q: rule %q: unknown permission %q (want lock, read or admin)", fi.Name, p, name)
				}
				ps |= perm.bit()
			}
			if ps != 0 {
				id.rules = append(id.rules, rule{prefix: p, perms: ps})
			}
		}
		ar.byName[fi.Name] = id
	}
	return ar, nil
}

// parsePermission parses "lock", "read" or "admin" (any case).
func parsePermission(s string) (Permission, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "lock":
		return PermLock, true
	case "read":
		return PermRead, true
	case "admin":
		return PermAdmin, true
	}
	return 0, false
}

// checkIdentityName allows 1 to 128 bytes of printable UTF-8 without
// spaces: the name goes into log and audit lines.
func checkIdentityName(name string) error {
	if name == "" {
		return errors.New("empty")
	}
	if len(name) > 128 {
		return fmt.Errorf("%d bytes > 128", len(name))
	}
	if !utf8.ValidString(name) {
		return errors.New("not valid UTF-8")
	}
	for _, r := range name {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("character %U not allowed (printable, no spaces)", r)
		}
	}
	return nil
}

// shorten cuts a value quoted in an error (a misplaced token, perhaps) to
// its first 6 bytes.
func shorten(s string) string {
	if len(s) <= 6 {
		return s
	}
	return s[:6] + "..."
}

// identityKey is the context key of the caller's identity.
type identityKey struct{}

// withIdentity returns ctx carrying id.
func withIdentity(ctx context.Context, id *identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// identityFrom returns the identity attached to ctx, or nil.
func identityFrom(ctx context.Context) *identity {
	id, _ := ctx.Value(identityKey{}).(*identity)
	return id
}

// viaOf is the member that forwarded ctx's call (its node ID), for audit
// lines, or "".
func viaOf(ctx context.Context) string {
	if id := identityFrom(ctx); id != nil {
		return id.via
	}
	return ""
}

// identityName is the name of ctx's identity for logs and audit lines:
// "anonymous" without one.
func identityName(ctx context.Context) string {
	if id := identityFrom(ctx); id != nil {
		return id.name
	}
	return "anonymous"
}

// unauthenticated is the UNAUTHENTICATED answer.
func unauthenticated(format string, a ...any) *apiError {
	return &apiError{code: codes.Unauthenticated, reason: ReasonUnauthenticated, msg: "unauthenticated: " + fmt.Sprintf(format, a...)}
}

// authenticate finds the identity of a call from its authorization values
// (metadata or header), its TLS state, and the identity a forwarding member
// names (onBehalf). It returns an UNAUTHENTICATED *apiError when there is
// no credential or it is unknown. Never call it without rules.
func (s *Server) authenticate(ar *authRules, authz []string, st *tls.ConnectionState, onBehalf string) (*identity, *apiError) {
	if len(authz) > 1 {
		return nil, unauthenticated("more than one authorization value")
	}
	if len(authz) == 1 {
		scheme, tok, _ := strings.Cut(strings.TrimSpace(authz[0]), " ")
		tok = strings.TrimSpace(tok)
		if !strings.EqualFold(scheme, "Bearer") || tok == "" {
			return nil, unauthenticated(`authorization: want "Bearer TOKEN"`)
		}
		sum := sha256.Sum256([]byte(tok))
		id := ar.byToken(sum)
		if id == nil {
			return nil, unauthenticated("unknown token (not in the auth file, or revoked)")
		}
		b := id.bound(ar, &sum, nil)
		if st != nil && len(st.PeerCertificates) > 0 {
			if node, ok := s.memberCert(st); ok {
				b.via = node // a member forwarded the client's token
			}
		}
		return b, nil
	}
	if st != nil && len(st.PeerCertificates) > 0 {
		if node, ok := s.memberCert(st); ok {
			if onBehalf == "" {
				return &identity{name: "member:" + node, member: true}, nil
			}
			id := ar.byName[onBehalf]
			if id == nil {
				return nil, unauthenticated("member %s forwarded a call of identity %q, which this node's auth file does not define", node, onBehalf)
			}
			b := id.bound(ar, nil, nil)
			b.via = node
			return b, nil
		}
		if len(st.VerifiedChains) > 0 {
			leaf := st.PeerCertificates[0]
			if id := ar.byCert(leaf); id != nil {
				return id.bound(ar, nil, leaf), nil
			}
			return nil, unauthenticated("client certificate (subject CN %q) maps to no identity of the auth file", leaf.Subject.CommonName)
		}
	}
	return nil, unauthenticated(`no credentials: send "authorization: Bearer TOKEN" (HTTP "Authorization: Bearer TOKEN") or a client certificate`)
}

// authorize returns nil when no AuthFile is configured or the identity of
// ctx has p on key; else an *apiError: UNAUTHENTICATED (HTTP 401) when ctx
// carries no identity, PERMISSION_DENIED (HTTP 403) naming the key and the
// missing permission. A refusal is audited (action "deny:<p>") and
// counted. key "" with PermAdmin is a cluster-wide admin action (it needs
// admin on the prefix "").
func (s *Server) authorize(ctx context.Context, p Permission, key string) error {
	return s.authorizeKey(ctx, p, key, false)
}

// authorizeKey is authorize; isPrefix says key is a prefix (a list's), for
// the refusal's message.
func (s *Server) authorizeKey(ctx context.Context, p Permission, key string, isPrefix bool) error {
	if !s.authEnabled() {
		return nil
	}
	id := identityFrom(ctx)
	if id == nil {
		err := unauthenticated("no identity")
		s.audit(ctx, "deny", key, err.msg, err)
		return err
	}
	if id = s.fresh(id); id == nil {
		err := unauthenticated("credentials revoked: the auth file was reloaded without them")
		s.audit(ctx, "deny", key, err.msg, err)
		return err
	}
	if id.can(p, key) {
		return nil
	}
	err := s.denied(id, p, key, isPrefix)
	s.audit(ctx, "deny", key, err.msg, err)
	return err
}

// denied is the PERMISSION_DENIED answer for id lacking p on key (on the
// prefix key, for a list, when isPrefix).
func (s *Server) denied(id *identity, p Permission, key string, isPrefix bool) *apiError {
	var msg string
	switch {
	case key == "" && isPrefix:
		msg = fmt.Sprintf("permission denied: identity %q lacks %s on any key (a list of the prefix \"\")", id.name, p)
	case key == "":
		msg = fmt.Sprintf("permission denied: identity %q lacks %s on the prefix \"\" (every key: a cluster-wide action)", id.name, p)
	case isPrefix:
		msg = fmt.Sprintf("permission denied: identity %q lacks %s on any key under the prefix %q", id.name, p, key)
	default:
		msg = fmt.Sprintf("permission denied: identity %q lacks %s on key %q", id.name, p, key)
	}
	return &apiError{code: codes.PermissionDenied, reason: ReasonPermissionDenied, msg: msg}
}

// authenticated returns nil when no AuthFile is configured or ctx carries
// an identity the rules in force know (whatever its rules), else the
// UNAUTHENTICATED *apiError (HTTP 401). It audits nothing: for pages that
// poll (the dashboard) and filter with allowed.
func (s *Server) authenticated(ctx context.Context) error {
	if !s.authEnabled() {
		return nil
	}
	id := identityFrom(ctx)
	if id == nil {
		return unauthenticated("no identity")
	}
	if s.fresh(id) == nil {
		return unauthenticated("credentials revoked: the auth file was reloaded without them")
	}
	return nil
}

// allowed reports what authorize would allow, without auditing: for
// filtering lists (List, the dashboard's keys).
func (s *Server) allowed(ctx context.Context, p Permission, key string) bool {
	if !s.authEnabled() {
		return true
	}
	id := s.fresh(identityFrom(ctx))
	return id != nil && id.can(p, key)
}

// readRanges returns the key ranges under prefix that the identity of ctx
// may read, as the minimal set of prefixes in key order: the intersection
// of prefix with each prefix on which the identity has read (or admin),
// nested ones reduced to the outer one. Each names a contiguous range of
// the ordered index, and the ranges are disjoint and ascending, so a list
// walks them in order and scans only keys the caller may read: its page
// tokens name only such keys, and its answers never depend on keys it may
// not read. Without an auth file, and for a member, it is [prefix]; an
// identity that may read nothing under prefix gets none (callers check
// authorizeList first, which refuses that case).
func (s *Server) readRanges(ctx context.Context, prefix string) []string {
	if !s.authEnabled() {
		return []string{prefix}
	}
	id := s.fresh(identityFrom(ctx))
	if id == nil {
		return nil
	}
	return id.readRanges(prefix)
}

// readRanges is Server.readRanges for id.
func (id *identity) readRanges(prefix string) []string {
	if id.member {
		return []string{prefix}
	}
	var rs []string
	for _, r := range id.rules {
		if !r.perms.has(PermRead) {
			continue
		}
		switch {
		case strings.HasPrefix(prefix, r.prefix): // every key under prefix
			return []string{prefix}
		case strings.HasPrefix(r.prefix, prefix): // the keys under r.prefix
			rs = append(rs, r.prefix)
		}
	}
	return minimalPrefixes(rs)
}

// minimalPrefixes sorts ps and drops every prefix that another one of ps
// is a prefix of (its keys are already in that one's range). Sorted, a
// prefix comes just before the strings it prefixes, so one pass against
// the last kept prefix is enough.
func minimalPrefixes(ps []string) []string {
	slices.Sort(ps)
	out := ps[:0]
	for _, p := range ps {
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// authorizeList allows a list of prefix when the identity of ctx may read
// some key under it; the list then scans only readRanges.
func (s *Server) authorizeList(ctx context.Context, prefix string) error {
	if !s.authEnabled() {
		return nil
	}
	id := s.fresh(identityFrom(ctx))
	if id != nil && id.canUnder(PermRead, prefix) {
		return nil
	}
	return s.authorizeKey(ctx, PermRead, prefix, true) // the refusal, audited
}

// authorizeRequest checks the permission a Lock or Cluster request needs:
// lock for acquisitions, renewals, releases and cancellations (every key of
// a renewal), read for inspections, lists and fence checks, admin for a
// force release, admin on "" for membership changes, read on "" for the
// cluster's status. A member's registration and join checks need nothing
// more than a member identity (they pass as admin).
func (s *Server) authorizeRequest(ctx context.Context, req any) error {
	if !s.authEnabled() {
		return nil
	}
	switch r := req.(type) {
	case *dlockv1.AcquireRequest:
		return s.authorize(ctx, PermLock, r.GetKey())
	case *dlockv1.RenewRequest:
		for _, it := range r.GetItems() {
			if err := s.authorize(ctx, PermLock, it.GetKey()); err != nil {
				return err
			}
		}
		return nil
	case *dlockv1.ReleaseRequest:
		return s.authorize(ctx, PermLock, r.GetKey())
	case *dlockv1.CancelWaitRequest:
		return s.authorize(ctx, PermLock, r.GetKey())
	case *dlockv1.CheckFenceRequest:
		return s.authorize(ctx, PermRead, r.GetKey())
	case *dlockv1.InspectRequest:
		return s.authorize(ctx, PermRead, r.GetKey())
	case *dlockv1.ListRequest:
		return s.authorizeList(ctx, r.GetPrefix())
	case *dlockv1.ForceReleaseRequest:
		return s.authorize(ctx, PermAdmin, r.GetKey())
	case *dlockv1.ClusterStatusRequest:
		return s.authorize(ctx, PermRead, "")
	case *dlockv1.AddVoterRequest, *dlockv1.RemoveServerRequest, *dlockv1.TransferLeaderRequest:
		return s.authorize(ctx, PermAdmin, "")
	case *dlockv1.SessionRequest:
		switch c := r.GetCall().(type) {
		case *dlockv1.SessionRequest_Acquire:
			return s.authorizeRequest(ctx, c.Acquire)
		case *dlockv1.SessionRequest_Release:
			return s.authorizeRequest(ctx, c.Release)
		case *dlockv1.SessionRequest_Renew:
			return s.authorizeRequest(ctx, c.Renew)
		}
		return nil
	}
	// A request this table does not know is refused rather than let
	// through: a new method must be added here.
	return apiErr(codes.Internal, ReasonInternal, "authorize: no rule for request type %T", req)
}

// authGRPC authenticates a gRPC call from its metadata and TLS state.
func (s *Server) authGRPC(ctx context.Context) (context.Context, error) {
	ar := s.auth.rules.Load()
	if ar == nil {
		return ctx, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var onBehalf string
	if v := md.Get(mdIdentity); len(v) > 0 {
		onBehalf = v[0]
	}
	id, err := s.authenticate(ar, md.Get(MetaAuthorization), tlsStateFromContext(ctx), onBehalf)
	if err != nil {
		s.audit(ctx, "deny", "", err.msg, err)
		return ctx, err
	}
	return withIdentity(ctx, id), nil
}

// authUnary is the gRPC unary interceptor: it authenticates the call and
// checks the permission of its request before the forwarder (a follower
// checks before it forwards; the handlers check again).
func (s *Server) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !s.authEnabled() {
		return h(ctx, req)
	}
	ctx, err := s.authGRPC(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.authorizeRequest(ctx, req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// authStream is the gRPC stream interceptor: it authenticates the stream;
// its handler checks each call (Session), the first message (Wait) or
// filters events (Watch).
func (s *Server) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !s.authEnabled() {
		return h(srv, ss)
	}
	ctx, err := s.authGRPC(ss.Context())
	if err != nil {
		return err
	}
	return h(srv, &identityStream{ServerStream: ss, ctx: ctx})
}

// identityStream is a server stream whose context carries the identity.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// publicPath reports whether an HTTP path needs no credentials: health,
// readiness, metrics, and the dashboard's static files (they hold no
// data; its data is under /ui/api/).
func publicPath(p string) bool {
	switch p {
	case "/healthz", "/readyz", "/metrics":
		return true
	}
	return strings.HasPrefix(p, "/ui/") && !strings.HasPrefix(p, "/ui/api/") || p == "/ui"
}

// authHTTP is the HTTP middleware: it authenticates every request but the
// public ones (publicPath: answered with an identity when the credentials
// are good, without one otherwise), answers 401 with WWW-Authenticate
// when it cannot, and needs admin on "" for /debug/pprof/. The JSON
// handlers check each request's permission.
func (s *Server) authHTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ar := s.auth.rules.Load()
		if ar == nil {
			h.ServeHTTP(w, r)
			return
		}
		ctx := withOperation(withRemote(r.Context(), r.RemoteAddr), r.Method+" "+r.URL.Path)
		id, aerr := s.authenticate(ar, r.Header.Values("Authorization"), tlsStateFromContext(ctx), r.Header.Get(HeaderIdentity))
		if aerr != nil {
			if publicPath(r.URL.Path) {
				h.ServeHTTP(w, r)
				return
			}
			s.audit(ctx, "deny", "", aerr.msg, aerr)
			w.Header().Set("WWW-Authenticate", `Bearer realm="dlockd"`)
			writeReply(w, nil, aerr)
			return
		}
		ctx = withIdentity(ctx, id)
		if strings.HasPrefix(r.URL.Path, "/debug/pprof") {
			if err := s.authorize(ctx, PermAdmin, ""); err != nil {
				writeReply(w, nil, err)
				return
			}
		}
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// onBehalfName is the name a member forwarding ctx's call sends in
// HeaderIdentity, or "" (no identity, or a member's own call).
func onBehalfName(ctx context.Context) string {
	if id := identityFrom(ctx); id != nil && !id.member {
		return id.name
	}
	return ""
}

// onBehalfOf returns the outgoing context of a call this node makes to
// another member for ctx's caller (a Cluster call forwarded to the
// leader): it names the caller's identity, which the leader trusts from a
// member.
func onBehalfOf(ctx context.Context) context.Context {
	if n := onBehalfName(ctx); n != "" {
		return metadata.AppendToOutgoingContext(ctx, mdIdentity, n)
	}
	return ctx
}

// setOnBehalf sets the identity a forwarded gRPC call acts for in md (a
// client's own value was not passed on: see passMetadata).
func setOnBehalf(ctx context.Context, md metadata.MD) {
	md.Delete(mdIdentity)
	if n := onBehalfName(ctx); n != "" {
		md.Set(mdIdentity, n)
	}
}

// setOnBehalfHeader is setOnBehalf for a forwarded HTTP request's header.
func setOnBehalfHeader(ctx context.Context, h http.Header) {
	h.Del(HeaderIdentity)
	if n := onBehalfName(ctx); n != "" {
		h.Set(HeaderIdentity, n)
	}
}

// authorizeForward checks, on a follower, the permission of an HTTP
// request it is about to forward to the leader (the leader checks again):
// the body (or the query of a GET) decoded as the route's request. A
// body that does not decode is left to the leader to refuse.
func (s *Server) authorizeForward(r *http.Request, body []byte) error {
	if !s.authEnabled() {
		return nil
	}
	ctx := r.Context()
	q := r.URL.Query()
	var req proto.Message
	switch r.URL.Path {
	case "/v1/acquire":
		req = new(dlockv1.AcquireRequest)
	case "/v1/renew":
		req = new(dlockv1.RenewRequest)
	case "/v1/release":
		req = new(dlockv1.ReleaseRequest)
	case "/v1/cancel-wait":
		req = new(dlockv1.CancelWaitRequest)
	case "/v1/check-fence":
		req = new(dlockv1.CheckFenceRequest)
	case "/v1/force-release":
		req = new(dlockv1.ForceReleaseRequest)
	case "/v1/inspect":
		if r.Method == http.MethodGet {
			return s.authorize(ctx, PermRead, q.Get("key"))
		}
		req = new(dlockv1.InspectRequest)
	case "/v1/list":
		if r.Method == http.MethodGet {
			return s.authorizeList(ctx, q.Get("prefix"))
		}
		req = new(dlockv1.ListRequest)
	default:
		return nil
	}
	if len(body) > 0 && jsonIn.Unmarshal(body, req) != nil {
		return nil
	}
	return s.authorizeRequest(ctx, req)
}

// validateAuth checks the authentication and audit settings: AuthFile on a
// cluster needs peer TLS and API TLS (members authenticate each other's
// API calls by their peer certificates), and the audit log's rotation
// bounds are not negative.
func (c Config) validateAuth() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("dlockd: config: "+format, a...)) }
	if c.AuthFile != "" && (len(c.InitialCluster) > 1 || c.Join != "") {
		if c.PeerCertFile == "" || c.TLSCertFile == "" {
			bad("AuthFile (--auth-file) on a cluster needs peer TLS (--peer-cert, --peer-key, --peer-ca) and API TLS (--tls-cert, --tls-key): members authenticate each other's forwarded and membership calls by their peer certificates")
		}
	}
	if c.AuditLogMaxBytes < 0 {
		bad("AuditLogMaxBytes %d is negative (0: the default, 100 MiB)", c.AuditLogMaxBytes)
	}
	if c.AuditLogMaxFiles < 0 {
		bad("AuditLogMaxFiles %d is negative (0: the default, 10)", c.AuditLogMaxFiles)
	}
	return errs
}
