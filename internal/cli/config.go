package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// fileConfig is the configuration file: flat YAML, every value a scalar.
// A key it does not know is an error (a typo must not pass silently).
type fileConfig struct {
	Store    string `yaml:"store"`
	TTL      string `yaml:"ttl"`
	Token    string `yaml:"token"`
	Output   string `yaml:"output"`
	Holder   string `yaml:"holder"`
	RetryFor string `yaml:"retry_for"`
}

// setting is one value that a flag, an environment variable or the
// configuration file can give, in that order of precedence.
type setting struct {
	flag string                     // flag name (persistent or the command's own)
	env  string                     // environment variable
	file func(c *fileConfig) string // the file's value, "" when unset
}

var settings = []setting{
	{"store", "DLOCK_STORE", func(c *fileConfig) string { return c.Store }},
	{"token", "DLOCK_TOKEN", func(c *fileConfig) string { return c.Token }},
	{"output", "DLOCK_OUTPUT", func(c *fileConfig) string { return c.Output }},
	{"ttl", "DLOCK_TTL", func(c *fileConfig) string { return c.TTL }},
	{"holder", "DLOCK_HOLDER", func(c *fileConfig) string { return c.Holder }},
	{"retry-for", "DLOCK_RETRY_FOR", func(c *fileConfig) string { return c.RetryFor }},
}

// configHelp is the part of dlock --help that documents the precedence.
const configHelp = `Configuration: every setting comes from, in order of precedence,
  1. its flag                    --store, --token, -o, run's --ttl and --holder, and
                                 --retry-for (run, status, list, release, fence check)
  2. its environment variable    DLOCK_STORE, DLOCK_TOKEN, DLOCK_OUTPUT, DLOCK_TTL,
                                 DLOCK_HOLDER, DLOCK_RETRY_FOR
  3. the configuration file      --config FILE, else DLOCK_CONFIG, else
                                 $XDG_CONFIG_HOME/dlock/config.yaml (default
                                 ~/.config/dlock/config.yaml; a missing default file is fine)
  4. the built-in default
The file is flat YAML with the keys store, ttl, token, output, holder and
retry_for, e.g.
  store: dlockd://10.0.0.5:7450
  ttl: 1m
  retry_for: 10s
An unknown key or a value that does not parse exits 64, naming the file.
DLOCK_TOKEN (token) is a bearer token for a dlockd started with --auth-file
(make one with dlock token new); it is sent in the authorization header of
every call, never in the URL. Keep the file mode 0600. A store URL may name
a file instead (dlockd://HOST:PORT?token_file=FILE). Other stores ignore it;
keep passwords of Redis or PostgreSQL in the store URL. A refused token or
permission exits 77 (EX_NOPERM).`

// configPath returns the configuration file to read and whether it was asked
// for explicitly (then it must exist).
func configPath(flagValue string) (string, bool) {
	if flagValue != "" {
		return flagValue, true
	}
	if p := os.Getenv("DLOCK_CONFIG"); p != "" {
		return p, true
	}
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "dlock", "config.yaml"), false
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", false
	}
	return filepath.Join(home, ".config", "dlock", "config.yaml"), false
}

// loadConfig reads the configuration file, if any. A file asked for with
// --config or DLOCK_CONFIG must exist; the default one may be absent.
func loadConfig(path string, explicit bool) (*fileConfig, error) {
	c := &fileConfig{}
	if path == "" {
		return c, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("configuration file: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) { // io.EOF: an empty file
		return nil, fmt.Errorf("configuration file %s: %s (known keys: store, ttl, token, output, holder, retry_for)", path, yamlProblem(err))
	}
	return c, nil
}

// applyConfig fills every setting of cmd that its flag did not set, from the
// environment, then from the configuration file. A value that does not parse
// is a usage error naming where it came from.
func applyConfig(cmd *cobra.Command, g *globals) error {
	path, explicit := configPath(g.configFile)
	c, err := loadConfig(path, explicit)
	if err != nil {
		return exit(ExitUsage, "%w", err)
	}
	for _, s := range settings {
		f := cmd.Flags().Lookup(s.flag)
		if f == nil || f.Changed {
			continue
		}
		if v, ok := os.LookupEnv(s.env); ok && v != "" {
			if err := f.Value.Set(v); err != nil {
				return exit(ExitUsage, "%s=%q: %v", s.env, v, err)
			}
			g.fromEnvOrFile[s.flag] = true
			g.source[s.flag] = s.env
			continue
		}
		if v := s.file(c); v != "" {
			if err := f.Value.Set(v); err != nil {
				return exit(ExitUsage, "configuration file %s: %s: %q: %v", path, strings.ReplaceAll(s.flag, "-", "_"), v, err)
			}
			g.fromEnvOrFile[s.flag] = true
			g.source[s.flag] = fmt.Sprintf("configuration file %s: %s", path, strings.ReplaceAll(s.flag, "-", "_"))
		}
	}
	if c.Token != "" {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
			fmt.Fprintf(g.stderr, "dlock: warning: configuration file %s holds a token but is readable by others (mode %v); chmod 600 it\n", path, st.Mode().Perm())
		}
	}
	return nil
}

// knownSchemes returns the store schemes this binary can open, sorted.
func knownSchemes(registered []string) string {
	s := append([]string(nil), registered...)
	sort.Strings(s)
	return strings.Join(s, ", ")
}

// yamlProblem says in plain words what is wrong with the configuration
// file, from the YAML decoder's error (which names Go types).
func yamlProblem(err error) string {
	var lines []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		lines = te.Errors
	} else {
		lines = []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	field := regexp.MustCompile(`^(line \d+: )?field (.*) not found in type .*$`)
	notScalar := regexp.MustCompile(`^(line \d+: )?cannot unmarshal !!(\w+)(?: .*)? into (.*)$`)
	for i, l := range lines {
		if m := field.FindStringSubmatch(l); m != nil {
			lines[i] = m[1] + "unknown key " + strconv.Quote(m[2])
			continue
		}
		if m := notScalar.FindStringSubmatch(l); m != nil {
			what := map[string]string{"seq": "a list", "map": "a mapping", "str": "a string", "int": "a number", "bool": "a boolean", "float": "a number"}[m[2]]
			if what == "" {
				what = "a " + m[2]
			}
			if strings.Contains(m[3], "fileConfig") {
				lines[i] = m[1] + "the file must be flat \"key: value\" lines, not " + what
			} else {
				lines[i] = m[1] + "a value must be a single word or string, not " + what
			}
		}
	}
	return strings.Join(lines, "; ")
}
