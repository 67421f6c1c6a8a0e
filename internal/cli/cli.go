// Package cli implements the dlock command line tool: dlock run (a command
// under a lease), status, list, release --force, fence check and bench. The
// command in cmd/dlock is a thin main over Main.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	_ "github.com/dlock-dev/dlock/drivers/azblobdriver"   // azblob://
	_ "github.com/dlock-dev/dlock/drivers/consuldriver"   // consul://
	"github.com/dlock-dev/dlock/drivers/dlockddriver"     // dlockd://
	_ "github.com/dlock-dev/dlock/drivers/dynamodbdriver" // dynamodb://
	_ "github.com/dlock-dev/dlock/drivers/etcddriver"     // etcd://
	_ "github.com/dlock-dev/dlock/drivers/gcsdriver"      // gs://
	_ "github.com/dlock-dev/dlock/drivers/memdriver"      // mem:// (in-process only)
	_ "github.com/dlock-dev/dlock/drivers/pgadvisory"     // pgadvisory://
	_ "github.com/dlock-dev/dlock/drivers/pgdriver"       // postgres://
	_ "github.com/dlock-dev/dlock/drivers/redisdriver"    // redis://
	_ "github.com/dlock-dev/dlock/drivers/redlockdriver"  // redlock://
	_ "github.com/dlock-dev/dlock/drivers/zkdriver"       // zk://
	"github.com/dlock-dev/dlock/internal/tlserr"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// Exit codes of dlock run and the other commands, from sysexits.h.
const (
	ExitOK           = 0
	ExitUsage        = 64  // EX_USAGE: bad flags or arguments
	ExitUnavailable  = 69  // EX_UNAVAILABLE: the store could not be reached; the command was not run
	ExitLost         = 70  // EX_SOFTWARE: the lease was lost while the command ran; it was terminated
	ExitHeld         = 75  // EX_TEMPFAIL: the key is held (or --wait-timeout passed); the command was not run (run --conflict-exit-code changes it)
	ExitNoPerm       = 77  // EX_NOPERM: the store refused the token (missing, unknown, revoked) or its permission on the key; the command was not run
	ExitUnsupported  = 78  // EX_CONFIG: the configured store cannot do this at all (status or list without an inspector, release --force without an override); retrying cannot help
	ExitVerifyFailed = 1   // dlock verify: a safety checker failed, or a run could not be made
	ExitInterrupted  = 130 // 128 + SIGINT: dlock verify interrupted; nothing judged
	ExitNotFound     = 127
	ExitCannotRun    = 126
)

// DefaultStore is the store URL used when neither --store, DLOCK_STORE nor
// the configuration file names one: the local dlockd.
const DefaultStore = "dlockd://127.0.0.1:7450"

// exitError carries an exit code through cobra, with the stable short code
// that -o json reports and the raw cause that --debug prints.
type exitError struct {
	code   int
	kind   string // "" : kindOf(code)
	err    error  // the one-line message; nil when already reported
	detail error  // the raw error behind a rewritten message, or nil
	// report, with -o json, is what the command measured before it
	// failed (bench's finished cells), printed as the error's "report".
	report any
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func exit(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

// Stable short codes of -o json errors, by exit status.
const (
	codeInvalid     = "invalid_argument"  // 64
	codeUnavailable = "unavailable"       // 69
	codeLost        = "lost"              // 70
	codeHeld        = "held"              // 75 (or --conflict-exit-code)
	codeUnsupported = "unsupported"       // 78
	codeNoPerm      = "permission_denied" // 77
	codeNotHeld     = "not_held"          // 1: release --force of a free key
	codeCannotRun   = "cannot_run"        // 126
	codeNotFound    = "not_found"         // 127
	codeInterrupted = "interrupted"       // 128+N: a wait ended by signal N
	codeError       = "error"             // 1: anything else
)

func kindOf(code int) string {
	switch {
	case code == ExitUsage:
		return codeInvalid
	case code == ExitUnavailable:
		return codeUnavailable
	case code == ExitLost:
		return codeLost
	case code == ExitHeld:
		return codeHeld
	case code == ExitUnsupported:
		return codeUnsupported
	case code == ExitNoPerm:
		return codeNoPerm
	case code == ExitCannotRun:
		return codeCannotRun
	case code == ExitNotFound:
		return codeNotFound
	case code > 128:
		return codeInterrupted
	}
	return codeError
}

// errorJSON is what a command that owns stdout prints there with -o json
// when it fails.
type errorJSON struct {
	Error    string `json:"error"`
	Code     string `json:"code"`
	ExitCode int    `json:"exit_code"`
	Detail   string `json:"detail,omitempty"`
	Report   any    `json:"report,omitempty"`
}

type globals struct {
	store      string
	output     string
	token      string // bearer token: dlockd stores (ContextWithToken at open; sent by the cluster commands' HTTP calls)
	configFile string
	debug      bool
	stdout     io.Writer
	stderr     io.Writer
	stdin      io.Reader
	ownsStdout bool // false for run: stdout belongs to the command
	// fromEnvOrFile holds the flags set from the environment or the
	// configuration file (their Changed stays false).
	fromEnvOrFile map[string]bool
	// source names where each of those came from, for messages:
	// "DLOCK_TTL" or "configuration file F, key ttl".
	source map[string]string
	// retryFor is the retry budget of status, list, release and fence
	// check for a store that cannot be reached (--retry-for).
	retryFor time.Duration
	// run's key and --report, for the report of a usage error that cobra
	// returns before run's own code runs.
	runKey    string
	runReport *string
}

// flagName names the setting of flag for a message: "--ttl", or where its
// value came from when not from the flag ("DLOCK_TTL=...", "configuration
// file F, key ttl").
func (g *globals) flagName(flag string) string {
	if s := g.source[flag]; s != "" {
		return s
	}
	return "--" + flag
}

func (g *globals) json() bool { return g.output == "json" }

func (g *globals) printJSON(v any) { _ = jsonTo(g.stdout).Encode(v) }

func jsonTo(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc
}

// storeURL returns the store URL parsed, or nil.
func (g *globals) storeURL() *url.URL {
	u, err := url.Parse(g.store)
	if err != nil {
		return nil
	}
	return u
}

// redactedStore returns the store URL without its password or the values
// of secret-looking parameters (urlparam.RedactString).
func (g *globals) redactedStore() string { return urlparam.RedactString(g.store) }

// storeAddr returns the store's address as host:port (host:port,... for
// Redlock), or the scheme when the URL names no host (and the redacted
// text when it does not parse).
func (g *globals) storeAddr() string {
	u := g.storeURL()
	if u == nil {
		return urlparam.RedactRaw(g.store)
	}
	if u.Host == "" {
		return u.Scheme + " store"
	}
	return u.Host
}

// storeProduct names the server behind the store's scheme, for hints.
func (g *globals) storeProduct() string {
	scheme := ""
	if u := g.storeURL(); u != nil {
		scheme = u.Scheme
	}
	switch scheme {
	case "dlockd":
		return "dlockd"
	case "redis", "rediss":
		return "Redis"
	case "redlock":
		return "every Redis node"
	case "etcd":
		return "etcd"
	case "zk":
		return "ZooKeeper"
	case "postgres", "postgresql", "pgadvisory":
		return "PostgreSQL"
	}
	return "the store"
}

// checkStore refuses, before any store is called, a store that is not a
// URL, names no known scheme or a port outside 1-65535: exit 64, naming
// what to write instead.
func (g *globals) checkStore() error {
	schemes := knownSchemes(driver.Schemes())
	if !strings.Contains(g.store, "://") {
		hint := ""
		if _, _, err := net.SplitHostPort(g.store); err == nil {
			hint = fmt.Sprintf("; did you mean --store dlockd://%s ?", g.store)
		}
		return exit(ExitUsage, "--store %q is not a store URL (SCHEME://HOST:PORT; schemes: %s)%s", g.store, schemes, hint)
	}
	u, err := url.Parse(g.store)
	if err != nil {
		return exit(ExitUsage, "--store %q is not a valid URL: %v", g.redactedStore(), errors.Unwrap(err))
	}
	if _, err := driver.Lookup(u.Scheme); err != nil {
		return exit(ExitUsage, "--store %q: this dlock has no %q store (schemes: %s)", urlparam.Redact(u), u.Scheme, schemes)
	}
	for _, hp := range strings.Split(u.Host, ",") {
		_, p, err := net.SplitHostPort(hp)
		if err != nil || p == "" {
			continue // no port: the driver's default
		}
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return exit(ExitUsage, "--store %q: port %q is not a TCP port (1-65535)", urlparam.Redact(u), p)
		}
	}
	return nil
}

// open opens the store: exit 69 when it cannot be reached, 64 when the URL
// or configuration is wrong.
func (g *globals) open(ctx context.Context, opts ...dlock.Option) (*dlock.Locker, error) {
	if err := g.checkStore(); err != nil {
		return nil, err
	}
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if g.token != "" && g.isDlockd() {
		// The token reaches the driver through the context, never the
		// URL (which is printed in errors and logs).
		octx = dlockddriver.ContextWithToken(octx, g.token)
	}
	l, err := dlock.Open(octx, g.store, opts...)
	if errors.Is(err, dlock.ErrUnavailable) {
		return nil, g.unavailable("open", "", err, 0)
	}
	if err != nil { // a bad URL or a configuration the driver refuses
		return nil, &exitError{code: ExitUsage, err: err}
	}
	return l, nil
}

// isDlockd reports whether the store URL is a dlockd one.
func (g *globals) isDlockd() bool {
	u := g.storeURL()
	return u != nil && u.Scheme == dlockddriver.Scheme
}

// noPerm is exit 77 (EX_NOPERM) for a call the store refused for its
// credentials, with a hint: which token was sent (never its text).
func (g *globals) noPerm(err error) error {
	hint := "check the token's rules in dlockd's --auth-file"
	switch {
	case strings.Contains(err.Error(), "refused this client's certificate"), strings.Contains(err.Error(), "client certificate is required"):
		hint = "set cert=FILE and key=FILE in the store URL to a valid certificate issued by dlockd's --tls-client-ca"
	case strings.Contains(err.Error(), "no credentials"):
		hint = "dlockd requires a token: set --token, DLOCK_TOKEN or the store URL's token_file=FILE"
	case strings.Contains(err.Error(), "unknown token"), strings.Contains(err.Error(), "revoked"):
		hint = "the token is not (or no longer) in dlockd's --auth-file: check " + g.tokenSource()
	}
	return &exitError{code: ExitNoPerm, err: fmt.Errorf("%w; %s", err, hint)}
}

// tokenSource names where the token came from, for hints.
func (g *globals) tokenSource() string {
	if s := g.source["token"]; s != "" {
		return s
	}
	if g.token != "" {
		return "--token"
	}
	return "the store URL's token_file"
}

// storeErr maps a store error of op on key to an exit code and a message:
// 64 for input the store or library refused, 78 when the store cannot do
// op, 69 when it could not be reached (with a hint), 1 otherwise.
func (g *globals) storeErr(op, key string, err error) error {
	switch {
	case errors.Is(err, dlock.ErrPermissionDenied): // before ErrInvalidArgument, which it matches
		return g.noPerm(err)
	case errors.Is(err, dlock.ErrInvalidArgument):
		return &exitError{code: ExitUsage, err: err}
	case errors.Is(err, dlock.ErrUnsupported):
		return exit(ExitUnsupported, "%w (see the driver's docs for what each store can do)", err)
	case errors.Is(err, dlock.ErrUnavailable):
		return g.unavailable(op, key, err, 0)
	}
	return exit(1, "%w", err)
}

// unavailable is the one-line message of an unreachable store: the
// operation, the key, the store's address, the cause in plain words and a
// hint. The raw error is kept for --debug and -o json's "detail".
func (g *globals) unavailable(op, key string, err error, retried time.Duration) error {
	what := op
	if key != "" {
		what = fmt.Sprintf("%s %q", op, key)
	}
	addr := g.storeAddr()
	after := ""
	if retried > 0 {
		after = fmt.Sprintf(", still after retrying for %v", retried)
	}
	cause := plainCause(err)
	hint := fmt.Sprintf("is %s running at %s? set --store or DLOCK_STORE", g.storeProduct(), addr)
	if tlsCause(cause) {
		// It answered: the TLS settings of the two sides do not agree.
		hint = "check the store URL's TLS parameters (tls, ca, cert, key, server_name) against the server's certificates"
	}
	if transientCause(cause) {
		hint = fmt.Sprintf("%s is starting or electing a leader; retry in a moment (or give --retry-for a longer budget)", g.storeProduct())
	}
	msg := fmt.Errorf("%s: cannot reach the store at %s (%s%s); %s", what, addr, cause, after, hint)
	return &exitError{code: ExitUnavailable, err: msg, detail: err}
}

// Plain causes of an unreachable store that say the server is there but
// not serving yet (restarting, electing a leader).
const (
	causeShuttingDown = "the server is shutting down"
	causeNoLeader     = "the cluster has no leader yet"
)

func transientCause(cause string) bool { return cause == causeShuttingDown || cause == causeNoLeader }

// retrying runs op (which opens what it needs) until it succeeds or fails
// with anything but ErrUnavailable, retrying with backoff (100 ms doubling
// to 1 s) for up to g.retryFor (--retry-for); then it returns the store
// error of op on key as storeErr does, saying how long it retried.
func (g *globals) retrying(ctx context.Context, op, key string, fn func(ctx context.Context) error) error {
	start := time.Now()
	pause := 100 * time.Millisecond
	for {
		err := fn(ctx)
		var ee *exitError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ee):
			if ee.code != ExitUnavailable {
				return err
			}
			if ee.detail != nil {
				err = ee.detail
			}
		case !errors.Is(err, dlock.ErrUnavailable):
			return g.storeErr(op, key, err)
		}
		elapsed := time.Since(start)
		if elapsed >= g.retryFor || ctx.Err() != nil {
			retried := time.Duration(0)
			if elapsed >= 100*time.Millisecond {
				retried = elapsed.Round(100 * time.Millisecond)
			}
			return g.unavailable(op, key, err, retried)
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(jittered(pause), g.retryFor-elapsed)):
		}
		pause = min(2*pause, time.Second)
	}
}

// jittered returns a pause drawn from [d/2, 3d/2), so that many dlock
// commands retrying a recovering store (cron jobs started at the same
// second) do not ask it again at the same moments.
func jittered(d time.Duration) time.Duration { return d/2 + rand.N(d) }

// addRetryFlag adds --retry-for to an inspection command.
func addRetryFlag(cmd *cobra.Command, g *globals) {
	cmd.Flags().DurationVar(&g.retryFor, "retry-for", DefaultRetryFor, "retry a store that cannot be reached (down, restarting, electing a leader) this long before exiting 69 (env DLOCK_RETRY_FOR, file: retry_for)")
}

// tlsRefusedCause is the cause in words when err says the server refused
// this client's certificate in the TLS handshake (its alert), else "".
func tlsRefusedCause(err error) string {
	if why, ok := tlserr.Refused(err.Error()); ok {
		return "the server refused this client's certificate: " + why
	}
	return ""
}

// tlsServerCause is the cause in words when err says this client did not
// accept the server's certificate (the name checked and the names it
// carries, an untrusted issuer, an expiry), else "". The dlockd driver's
// explanation is kept as it is; a raw x509 error (the CLI's own HTTPS
// calls) is explained by tlserr.
func tlsServerCause(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "the server's certificate "); i >= 0 {
		msg = msg[i:]
		if j := strings.Index(msg, " (tls: failed to verify"); j >= 0 {
			msg = msg[:j]
		}
		return msg
	}
	if why, ok := tlserr.ServerCert(err, ""); ok {
		return why
	}
	return ""
}

// tlsCause reports whether a plainCause is about TLS: the server answered,
// so "is it running?" is not the question.
func tlsCause(cause string) bool {
	return strings.HasPrefix(cause, "the server's certificate") || strings.HasPrefix(cause, "the server refused this client's certificate") ||
		strings.HasPrefix(cause, "TLS handshake failed") || strings.Contains(cause, "add tls=1")
}

// plainCause says in plain words why a store could not be reached, from the
// raw error's text (gRPC and driver dumps are not for the user).
func plainCause(err error) string {
	s := strings.ToLower(err.Error())
	switch {
	// TLS (issue 12), before the generic cases that would hide it.
	case strings.Contains(s, "server preface"):
		return "the connection was closed before the HTTP/2 preface: if dlockd serves TLS, add tls=1 (and ca=FILE) to the store URL"
	case tlsRefusedCause(err) != "":
		return tlsRefusedCause(err)
	case tlsServerCause(err) != "":
		return tlsServerCause(err)
	case strings.Contains(s, "x509:"):
		return "the server's certificate is not trusted: set ca=FILE (the CA that signed it) in the store URL"
	case strings.Contains(s, "connection refused"):
		return "connection refused: nothing listens there"
	case strings.Contains(s, "no such host"):
		return "host name not found"
	case strings.Contains(s, "shutting_down"), strings.Contains(s, "shutting down"):
		return causeShuttingDown
	case strings.Contains(s, "not_leader"), strings.Contains(s, "no leader"), strings.Contains(s, "not the leader"):
		return causeNoLeader
	case strings.Contains(s, "network is unreachable"), strings.Contains(s, "no route to host"):
		return "network unreachable"
	case strings.Contains(s, "connection reset"), strings.Contains(s, "broken pipe"), strings.Contains(s, "eof"):
		return "the connection was closed"
	case strings.Contains(s, "i/o timeout"), strings.Contains(s, "deadline"), strings.Contains(s, "timed out"), strings.Contains(s, "timeout"):
		return "no answer in time"
	case strings.Contains(s, "tls"), strings.Contains(s, "certificate"):
		return "TLS handshake failed"
	case strings.Contains(s, "auth"), strings.Contains(s, "password"):
		return "authentication failed"
	}
	// The innermost error, without gRPC's prefix, kept short.
	for e := errors.Unwrap(err); e != nil; e = errors.Unwrap(e) {
		err = e
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, "desc = "); i >= 0 {
		msg = msg[i+len("desc = "):]
	}
	if len(msg) > 160 {
		msg = msg[:160] + "..."
	}
	return msg
}

// Main runs the dlock tool with args (without the program name) and returns
// the process exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// dlock run's stdout belongs to its command, even for usage errors.
	g := &globals{stdout: stdout, stderr: stderr, stdin: stdin, ownsStdout: !isRun(args), fromEnvOrFile: map[string]bool{}, source: map[string]string{}}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		ee = &exitError{code: ExitUsage, err: err}
		if strings.Contains(err.Error(), "flag") && runWithoutDash(args) {
			ee.err = fmt.Errorf("%w (dlock run takes the command after --: dlock run [flags] KEY -- COMMAND [ARGS...])", err)
		}
	}
	if ee.err == nil {
		return ee.code // already reported
	}
	if !g.ownsStdout {
		// dlock run: an error before its own code ran (a flag or argument
		// cobra refused) still gets the one-line report.
		return runErrorReport(g, args, ee)
	}
	printErr(stderr, ee.err)
	if g.debug && ee.detail != nil {
		fmt.Fprintf(stderr, "dlock: debug: %v\n", ee.detail)
	}
	// -o json from the arguments or the environment when cobra failed
	// before it parsed them (an unknown command or flag).
	if g.json() || outputOf(args) == "json" {
		kind := ee.kind
		if kind == "" {
			kind = kindOf(ee.code)
		}
		obj := errorJSON{Error: strings.TrimPrefix(ee.err.Error(), "dlock: "), Code: kind, ExitCode: ee.code}
		if ee.detail != nil {
			obj.Detail = ee.detail.Error()
		}
		obj.Report = ee.report
		_ = jsonTo(stdout).Encode(obj)
	}
	return ee.code
}

// outputOf returns the -o/--output value in args (before any "--"), else
// DLOCK_OUTPUT's: for errors cobra returns before it parses the flags.
func outputOf(args []string) string {
	if v, ok := flagValue(args, "o", "output"); ok {
		return v
	}
	return os.Getenv("DLOCK_OUTPUT")
}

// flagValue returns the value of the flag -short/--long in args (before
// any "--"), the last one given, as pflag would.
func flagValue(args []string, short, long string) (string, bool) {
	val, found := "", false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		for _, name := range []string{"--" + long, "-" + short} {
			if name == "-" {
				continue
			}
			switch {
			case a == name && i+1 < len(args):
				val, found = args[i+1], true
				i++
			case strings.HasPrefix(a, name+"="):
				val, found = strings.TrimPrefix(a, name+"="), true
			case len(name) == 2 && strings.HasPrefix(a, name) && len(a) > 2 && a[2] != '-':
				val, found = a[2:], true // -ojson
			default:
				continue
			}
			break
		}
	}
	return val, found
}

// runErrorReport reports an error of dlock run that its own code did not
// report: the text line on stderr, and the one-line JSON report with -o
// json (last line of stderr) or --report (that file or descriptor).
func runErrorReport(g *globals, args []string, ee *exitError) int {
	printErr(g.stderr, ee.err)
	if g.debug && ee.detail != nil {
		fmt.Fprintf(g.stderr, "dlock: debug: %v\n", ee.detail)
	}
	spec := ""
	if g.runReport != nil {
		spec = *g.runReport
	}
	if spec == "" {
		spec, _ = flagValue(args, "", "report")
	}
	var w io.Writer
	if spec != "" {
		rw, err := openReport(spec)
		if err == nil {
			defer rw.Close()
			w = rw
		} else if err.Error() != ee.err.Error() {
			printErr(g.stderr, err)
		}
	}
	if w == nil && (g.json() || outputOf(args) == "json" || spec != "") {
		w = g.stderr
	}
	if w != nil {
		kind := ee.kind
		if kind == "" {
			kind = kindOf(ee.code)
		}
		result := "invalid"
		if ee.code != ExitUsage {
			result = kind
		}
		// The store as the command would have used it, when cobra failed
		// before the flags and the environment were applied.
		sg := *g
		if v, ok := flagValue(args, "", "store"); ok {
			sg.store = v
		} else if v := os.Getenv("DLOCK_STORE"); v != "" && !g.fromEnvOrFile["store"] {
			sg.store = v
		}
		res := runResult{Key: g.runKey, Store: sg.redactedStore(), Result: result, Code: kind, ExitCode: ee.code,
			Error: strings.TrimPrefix(ee.err.Error(), "dlock: ")}
		b, _ := json.Marshal(res)
		_, _ = w.Write(append(b, '\n'))
	}
	return ee.code
}

// isRun reports whether args name the run command (before any "--").
func isRun(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "run" {
			return true
		}
	}
	return false
}

// runWithoutDash reports whether args are a dlock run without "--".
func runWithoutDash(args []string) bool {
	isRun := false
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "run" {
			isRun = true
		}
	}
	return isRun
}

func printErr(w io.Writer, err error) {
	msg := err.Error()
	if !strings.HasPrefix(msg, "dlock: ") {
		msg = "dlock: " + msg
	}
	fmt.Fprintln(w, msg)
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "dlock",
		Short: "Distributed locks with leases and fencing tokens",
		Long: `dlock runs commands under a distributed lease and inspects lock stores.

The store is a URL, SCHEME://HOST:PORT (default ` + DefaultStore + `, a
local dlockd). Schemes: dlockd, redis, redlock, etcd, zk, postgres,
pgadvisory (and mem, which lives inside one process only).

` + configHelp + `

With -o json, a command that fails prints {"error", "code", "exit_code"} on
stdout (dlock run: where its report goes, see dlock run --help); code is
one of invalid_argument (64), unavailable (69), lost (70), held (75),
unsupported (78), not_held (1), cannot_run (126), not_found (127),
interrupted (128+N), error (1).`,
		Example: `  dlock run payout:2026-09 -- ./payout --month 2026-09
  dlock run --wait --wait-timeout 5m nightly-report -- ./report.sh
  dlock status payout:2026-09
  dlock list settle:
  DLOCK_STORE=redis://127.0.0.1:6379 dlock run job -- echo hello
  dlock --config /etc/dlock.yaml list`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.store, "store", DefaultStore, "lock store URL (env DLOCK_STORE, file: store)")
	pf.StringVarP(&g.output, "output", "o", "text", `output format: "text" or "json" (env DLOCK_OUTPUT, file: output)`)
	pf.StringVar(&g.token, "token", "", "bearer token for a dlockd started with --auth-file (env DLOCK_TOKEN, file: token; or the URL's token_file=FILE); other stores ignore it. A flag is visible to every user in ps and /proc: prefer DLOCK_TOKEN or token_file=FILE")
	pf.StringVar(&g.configFile, "config", "", "configuration file (env DLOCK_CONFIG; default ~/.config/dlock/config.yaml)")
	pf.BoolVar(&g.debug, "debug", false, "print the raw store errors, and with run how the command is supervised, to stderr")
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if err := applyConfig(cmd, g); err != nil {
			return err
		}
		if g.output != "text" && g.output != "json" {
			return exit(ExitUsage, "--output must be text or json, not %q", g.output)
		}
		return nil
	}
	root.AddCommand(newRunCmd(g), newStatusCmd(g), newListCmd(g), newReleaseCmd(g), newFenceCmd(g), newBenchCmd(g))
	root.AddCommand(newVersionCmd(g))
	root.AddCommand(newClusterCmd(g))
	root.AddCommand(newTokenCmd(g))  // token.go: tokens for dlockd's --auth-file
	root.AddCommand(newElectCmd(g))  // elect.go: dlock elect NAME -- COMMAND (recipe/election)
	root.AddCommand(newVerifyCmd(g)) // verify.go: dlock verify, dlock verify matrix (package verify)
	return root
}
