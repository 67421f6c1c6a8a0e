package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock/internal/authtoken"
)

// dlock token: make and hash bearer tokens for dlockd's --auth-file, so
// that operators never hash by hand (internal/authtoken does it the one
// way the server checks).

func newTokenCmd(g *globals) *cobra.Command {
	tok := &cobra.Command{
		Use:   "token",
		Short: "Make bearer tokens for dlockd's --auth-file",
		Long: `dlockd started with --auth-file authenticates every call by a bearer token
(or a client certificate). The auth file stores only each token's SHA-256,
with a name and rules of key prefix to permissions (lock, read, admin).
"dlock token new" makes a random token and prints the auth file entry for it;
"dlock token hash" prints the hash of a token read on stdin.`,
		Example: `  # a token that may lock keys under payout: and read them
  dlock token new payout-worker --rule payout:=lock,read --token-file /etc/payout/dlock.token
  # then paste the printed entry under "identities:" and: kill -HUP $(pidof dlockd)
  dlock --store 'dlockd://10.0.0.5:7450?tls=1&ca=ca.pem&token_file=/etc/payout/dlock.token' run payout:42 -- ./pay
  # the hash of an existing token
  dlock token hash < /etc/payout/dlock.token`,
	}
	tok.AddCommand(newTokenNewCmd(g), newTokenHashCmd(g))
	return tok
}

// tokenEntry is -o json's answer of token new and token hash.
type tokenEntry struct {
	Name        string              `json:"name,omitempty"`
	Token       string              `json:"token,omitempty"`
	TokenFile   string              `json:"token_file,omitempty"`
	TokenSHA256 string              `json:"token_sha256"`
	Rules       map[string][]string `json:"rules,omitempty"`
	Entry       string              `json:"entry,omitempty"`
}

func newTokenNewCmd(g *globals) *cobra.Command {
	var rules []string
	var tokenFile string
	cmd := &cobra.Command{
		Use:   "new NAME",
		Short: "Make a random token and print its auth file entry",
		Long: `new makes a token of 256 random bits and prints it once (or writes it to
--token-file, created with mode 0600, never overwriting a file), followed by
the entry to add under "identities:" in dlockd's --auth-file: the name, the
token's SHA-256 and the rules. dlockd reads the file again on SIGHUP. The
token itself is stored nowhere else: keep it, or make a new one.

--rule PREFIX=PERMISSION[,PERMISSION] (repeatable) grants permissions on the
keys starting with PREFIX ("" is every key): lock (acquire, renew, release),
read (status, list, fence check), admin (release --force, cluster changes;
implies read).`,
		Args: exactArgs(1, "dlock token new NAME [--rule PREFIX=PERMISSION,...] [--token-file FILE]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := checkTokenName(name); err != nil {
				return exit(ExitUsage, "token new: name %q: %v", name, err)
			}
			rs, err := parseRules(rules)
			if err != nil {
				return exit(ExitUsage, "token new: %v", err)
			}
			for _, w := range ruleWarnings(rs) {
				fmt.Fprintf(g.stderr, "dlock: warning: %s\n", w)
			}
			tok, err := authtoken.New()
			if err != nil {
				return exit(1, "token new: %v", err)
			}
			if tokenFile != "" {
				if err := writeTokenFile(tokenFile, tok); err != nil {
					return exit(1, "token new: --token-file: %v", err)
				}
			}
			e := tokenEntry{Name: name, TokenSHA256: authtoken.Hash(tok), Rules: rs, TokenFile: tokenFile}
			e.Entry = authEntry(e)
			if tokenFile == "" {
				e.Token = tok
			}
			if g.json() {
				g.printJSON(e)
				return nil
			}
			if tokenFile == "" {
				fmt.Fprintf(g.stdout, "# token (shown once; give it to the client, e.g. in a file of mode 0600 for token_file=FILE or DLOCK_TOKEN):\n%s\n\n", tok)
			} else {
				fmt.Fprintf(g.stdout, "# token written to %s (mode 0600)\n", tokenFile)
			}
			fmt.Fprintf(g.stdout, "# add under \"identities:\" in dlockd's --auth-file, then send dlockd SIGHUP:\n%s", e.Entry)
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&rules, "rule", nil, `PREFIX=PERMISSION[,PERMISSION]: permissions (lock, read, admin) on keys starting with PREFIX (repeatable; "=read" is every key)`)
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "write the token to this new file (mode 0600) instead of printing it")
	return cmd
}

func newTokenHashCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "hash",
		Short: "Print the SHA-256 of a token read on stdin",
		Long: `hash reads one token on stdin (its trailing newline trimmed) and prints its
SHA-256 as the auth file's token_sha256 wants it (64 lower-case hex digits).
The token is never printed.`,
		Args: exactArgs(0, "dlock token hash < TOKEN_FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := io.ReadAll(io.LimitReader(g.stdin, 4097))
			if err != nil {
				return exit(1, "token hash: read stdin: %v", err)
			}
			if len(b) > 4096 {
				return exit(ExitUsage, "token hash: stdin holds more than 4096 bytes: want one token")
			}
			tok := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
			if tok == "" {
				return exit(ExitUsage, "token hash: no token on stdin (e.g. dlock token hash < FILE)")
			}
			if i := strings.IndexFunc(tok, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
				return exit(ExitUsage, "token hash: the token has a space or control character at byte %d: want one token on one line", i)
			}
			h := authtoken.Hash(tok)
			if g.json() {
				g.printJSON(tokenEntry{TokenSHA256: h})
				return nil
			}
			fmt.Fprintln(g.stdout, h)
			return nil
		},
	}
}

// checkTokenName is dlockd's rule for identity names: 1 to 128 bytes of
// printable UTF-8 without spaces.
func checkTokenName(name string) error {
	if name == "" || len(name) > 128 {
		return fmt.Errorf("want 1 to 128 bytes, got %d", len(name))
	}
	for _, r := range name {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("character %U not allowed (printable, no spaces)", r)
		}
	}
	return nil
}

// parseRules parses --rule values PREFIX=PERM[,PERM].
func parseRules(rules []string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, r := range rules {
		i := strings.LastIndex(r, "=")
		if i < 0 {
			return nil, fmt.Errorf("--rule %q: want PREFIX=PERMISSION[,PERMISSION] (e.g. payout:=lock)", r)
		}
		prefix, perms := r[:i], r[i+1:]
		for _, p := range strings.Split(perms, ",") {
			p = strings.ToLower(strings.TrimSpace(p))
			switch p {
			case "lock", "read", "admin":
			default:
				return nil, fmt.Errorf("--rule %q: unknown permission %q (want lock, read or admin)", r, p)
			}
			if !slices.Contains(out[prefix], p) {
				out[prefix] = append(out[prefix], p)
			}
		}
	}
	return out, nil
}

// ruleWarnings returns a warning for each prefix of rs that ends with a
// letter or a digit: prefixes match bytes, so "payout" also matches
// "payouts-internal:..."; a separator ("payout:") is almost always meant.
func ruleWarnings(rs map[string][]string) []string {
	prefixes := make([]string, 0, len(rs))
	for p := range rs {
		prefixes = append(prefixes, p)
	}
	slices.Sort(prefixes)
	var out []string
	for _, p := range prefixes {
		r, _ := utf8.DecodeLastRuneInString(p)
		if p == "" || !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			continue
		}
		out = append(out, fmt.Sprintf("--rule prefix %q matches every key starting with those bytes, %q too; did you mean %q (with the separator your keys use)?", p, p+"s-internal:1", p+":"))
	}
	return out
}

// authEntry writes e as an item of the auth file's identities list (YAML).
func authEntry(e tokenEntry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - name: %s\n    token_sha256: %s\n", strconv.Quote(e.Name), e.TokenSHA256)
	if len(e.Rules) == 0 {
		b.WriteString("    rules: {}  # e.g. \"payout:\": [lock]\n")
		return b.String()
	}
	b.WriteString("    rules:\n")
	prefixes := make([]string, 0, len(e.Rules))
	for p := range e.Rules {
		prefixes = append(prefixes, p)
	}
	slices.Sort(prefixes)
	for _, p := range prefixes {
		fmt.Fprintf(&b, "      %s: [%s]\n", strconv.Quote(p), strings.Join(e.Rules[p], ", "))
	}
	return b.String()
}

// writeTokenFile writes tok and a newline to a new file of mode 0600.
func writeTokenFile(path, tok string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%s exists: not overwriting a token", path)
		}
		return err
	}
	w := bufio.NewWriter(f)
	_, _ = w.WriteString(tok + "\n")
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
