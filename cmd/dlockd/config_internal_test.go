package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/dlock-dev/dlock/server"
)

// writeConfig writes a config file in a temp dir and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "dlockd.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// configFlags returns dlockd's flag set over cfg, parsed from args.
func configFlags(t *testing.T, cfg *server.Config, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("dlockd", pflag.ContinueOnError)
	fs.String(configFlag, "", "")
	fs.Bool("version", false, "")
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestApplyConfigFile_ValuesAndCommandLineWins: scalars, durations,
// booleans, lists and mappings reach the Config; a flag on the command
// line wins over the file's key.
func TestApplyConfigFile_ValuesAndCommandLineWins(t *testing.T) {
	path := writeConfig(t, `# n1 of three
node-id: n1
listen: 127.0.0.1:7450        # overridden below
data: /var/lib/dlockd
max-ttl: 2h
pprof: true
max-waiters-per-key: 77
batching: off
initial-cluster:
  - n1=127.0.0.1:7451
  - n2=127.0.0.1:7461
test-raft-dial-rewrite: {127.0.0.1:7461: 127.0.0.1:9461}
`)
	cfg := server.DefaultConfig()
	fs := configFlags(t, &cfg, "--listen", "127.0.0.1:9999", "--max-waiters-per-key=5")
	if err := applyConfigFile(fs, path); err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9999" || cfg.MaxWaitersPerKey != 5 {
		t.Errorf("command line lost: listen %q, max-waiters-per-key %d", cfg.Listen, cfg.MaxWaitersPerKey)
	}
	if cfg.NodeID != "n1" || cfg.DataDir != "/var/lib/dlockd" || cfg.MaxTTL != 2*time.Hour || !cfg.Pprof || cfg.Batching != server.BatchNever {
		t.Errorf("file values: node-id %q data %q max-ttl %v pprof %v batching %q", cfg.NodeID, cfg.DataDir, cfg.MaxTTL, cfg.Pprof, cfg.Batching)
	}
	if got := server.FormatInitialCluster(cfg.InitialCluster); got != "n1=127.0.0.1:7451,n2=127.0.0.1:7461" {
		t.Errorf("initial-cluster from a list: %q", got)
	}
	if got := cfg.RaftDialRewrite["127.0.0.1:7461"]; got != "127.0.0.1:9461" {
		t.Errorf("mapping value: rewrite %v", cfg.RaftDialRewrite)
	}

	// A mapping for initial-cluster, and an empty file.
	cfg = server.DefaultConfig()
	fs = configFlags(t, &cfg)
	if err := applyConfigFile(fs, writeConfig(t, "initial-cluster: {n1: 127.0.0.1:7451, n2: 127.0.0.1:7461}\n")); err != nil {
		t.Fatal(err)
	}
	if got := server.FormatInitialCluster(cfg.InitialCluster); got != "n1=127.0.0.1:7451,n2=127.0.0.1:7461" {
		t.Errorf("initial-cluster from a mapping: %q", got)
	}
	before := server.DefaultConfig()
	cfg = server.DefaultConfig()
	if err := applyConfigFile(configFlags(t, &cfg), writeConfig(t, "# nothing yet\n")); err != nil || cfg.Listen != before.Listen {
		t.Errorf("empty file: %v, listen %q", err, cfg.Listen)
	}
}

// TestRun_ConfigFileErrorsExit2: every bad config file exits 2 with one
// line naming the file, the key and the problem, before anything starts.
func TestRun_ConfigFileErrorsExit2(t *testing.T) {
	cases := []struct {
		name, text string
		want       []string // in the line besides the file's path
	}{
		{"unknown key", "listen: 127.0.0.1:0\nlisten-on: 1.2.3.4:5\n", []string{":2:", `unknown key "listen-on"`, "dlockd --help"}},
		{"underscore", "peer_cert: a.pem\n", []string{`unknown key "peer_cert"`, `did you mean "peer-cert"?`}},
		{"bad duration", "max-ttl: 5\n", []string{":1:", `key "max-ttl"`, `bad value "5"`, "missing unit"}},
		{"bad int", "max-leases: lots\n", []string{`key "max-leases"`, `bad value "lots"`}},
		{"bad bool", "pprof: maybe\n", []string{`key "pprof"`, `bad value "maybe"`}},
		{"bad initial cluster", "initial-cluster: [n1]\n", []string{`key "initial-cluster"`, "want id=host:port"}},
		{"twice", "listen: a:1\nlisten: b:2\n", []string{":2:", `key "listen" given twice (first on line 1)`}},
		{"nested config", "config: other.yaml\n", []string{`key "config" not allowed`}},
		{"version", "version: true\n", []string{`key "version" not allowed`}},
		{"null", "peer-cert:\n", []string{`key "peer-cert"`, "no value"}},
		{"nested list", "initial-cluster: [[a]]\n", []string{`key "initial-cluster"`, "plain value"}},
		{"not a mapping", "- listen: a\n", []string{"want a mapping", "not a list"}},
		{"not yaml", "listen: [a\n", []string{"not YAML"}},
		// A list or mapping for a one-value flag (it used to read as
		// "a,b" and fail later); yes/no for a boolean.
		{"list for a scalar", "listen: [a, b]\n", []string{":1:", `key "listen" takes one value`, "not a list"}},
		{"mapping for a scalar", "data: {a: b}\n", []string{`key "data" takes one value`, "not a mapping"}},
		{"yes for a bool", "insecure-listen: yes\n", []string{`key "insecure-listen"`, `bad value "yes"`, "want true or false"}},
		{"bad batch mode", "batching: sometimes\n", []string{`key "batching"`, `bad value "sometimes"`, "auto, on or off"}},
		{"empty batch mode", "batching: \"\"\n", []string{`key "batching"`, "not a batch mode"}},
		// Values the flags take but dlockd refuses after parsing: the
		// file's line too, not the flag's name alone.
		{"negative headroom", "listen: 127.0.0.1:0\ngc-headroom-bytes: -1\n", []string{":2:", `key "gc-headroom-bytes"`, `bad value "-1"`, "want 0 (off) or a positive number of bytes"}},
		{"gc percent", "gc-percent: -02\n", []string{":1:", `key "gc-percent"`, `bad value "-02"`, "want -1 (GC off)"}},
		{"negative release", "release-memory-after: -90s\n", []string{":1:", `key "release-memory-after"`, `bad value "-90s"`, "positive duration"}},
		{"log level", "log-level: loud\n", []string{":1:", `key "log-level"`, `bad value "loud"`, "want debug, info, warn or error"}},
		{"log format", "log-format: xml\n", []string{":1:", `key "log-format"`, `bad value "xml"`, "want text or json"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeConfig(t, c.text)
			var stdout, stderr bytes.Buffer
			if code := run([]string{"--config", path}, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2; stderr %q", code, stderr.String())
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "dlockd: "+path) {
				t.Errorf("stderr %q: want one line starting with dlockd: %s", msg, path)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("stderr %q lacks %q", msg, w)
				}
			}
		})
	}

	// A file that is not there, or a directory.
	for _, path := range []string{filepath.Join(t.TempDir(), "missing.yaml"), t.TempDir()} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"--config", path}, &stdout, &stderr); code != 2 {
			t.Fatalf("--config %s: exit %d, want 2", path, code)
		}
		if msg := stderr.String(); strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "--config "+path+": ") {
			t.Errorf("--config %s: stderr %q", path, msg)
		}
	}
	// The same values on the command line are named as flags.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--gc-headroom-bytes", "-1"}, "dlockd: --gc-headroom-bytes -1: want 0 (off)"},
		{[]string{"--log-level", "loud"}, `dlockd: --log-level "loud": want debug`},
		// The command line wins over the file, and its value is the one named.
		{[]string{"--config", writeConfig(t, "gc-percent: 50\n"), "--gc-percent", "-3"}, "dlockd: --gc-percent -3: want -1 (GC off)"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != 2 || !strings.HasPrefix(stderr.String(), c.want) || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, stderr.String(), c.want)
		}
	}
	// A value the file sets that Validate refuses is refused like the flag.
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--config", writeConfig(t, "max-ttl: 1ms\n")}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "1ms") {
		t.Errorf("max-ttl 1ms from the file: exit %d, stderr %q", code, stderr.String())
	}
}

// TestBatchingFlag: --batching takes auto, on or off in any case, and
// refuses anything else, the empty value included (it would otherwise
// count as set and override the config file's key with nothing).
func TestBatchingFlag(t *testing.T) {
	for _, c := range []struct {
		arg  string
		want server.BatchMode // "" for refused
	}{
		{"off", server.BatchNever}, {"ON", server.BatchAlways}, {" Auto ", server.BatchAuto},
		{"", ""}, {" ", ""}, {"sometimes", ""}, {"false", ""},
	} {
		cfg := server.DefaultConfig()
		fs := pflag.NewFlagSet("dlockd", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.RegisterFlags(fs)
		err := fs.Parse([]string{"--batching", c.arg})
		switch {
		case c.want == "" && (err == nil || !strings.Contains(err.Error(), "not a batch mode (auto, on or off)")):
			t.Errorf("--batching %q: %v, want refused naming the modes", c.arg, err)
		case c.want != "" && (err != nil || cfg.Batching != c.want):
			t.Errorf("--batching %q: %v, mode %q; want %q", c.arg, err, cfg.Batching, c.want)
		}
	}
}
