package main

// config.go reads dlockd's --config file: the flags' values, in YAML.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// configFlag is the flag naming the config file.
const configFlag = "config"

// notInFile are the flags a config file cannot set: the file itself, and
// the ones that make dlockd print something and exit.
var notInFile = map[string]string{
	configFlag: "a config file cannot name another one",
	"version":  "it is a command-line action, not a setting",
	"help":     "it is a command-line action, not a setting",
}

// maxConfigBytes bounds the config file dlockd reads.
const maxConfigBytes = 1 << 20

// applyConfigFile sets fs's flags from the YAML file at path, except those
// already set on the command line (they win). The file is one mapping
// whose keys are long flag names without the dashes ("listen",
// "tls-cert", "initial-cluster"); a value is a scalar (as on the command
// line: "30s", 100, true), or, for a flag that takes a list, a list (its
// items joined with commas: initial-cluster as a list of "id=host:port")
// or a mapping (its entries joined as k=v with commas: initial-cluster as
// {n1: host:port, ...}); a list for any other flag is an error naming the
// key (listen: [a, b] would otherwise read as "a,b"). An
// empty file sets nothing. A relative path in a value is relative to
// dlockd's working directory, as on the command line.
//
// The error is one line naming the file (and line), the key and the
// problem: the file cannot be read or is not YAML, its top level is not a
// mapping, a key is not a dlockd flag or is given twice, a value is empty,
// nested too deep or a list for a one-value flag, or the flag refuses the
// value (a boolean: "want true or false").
func applyConfigFile(fs *pflag.FlagSet, path string) error {
	data, err := readConfigFile(path)
	if err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("%s: not YAML: %s", path, oneLine(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	if len(doc.Content) == 0 { // empty, or comments only
		return nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: want a mapping of flag names to values (listen: 127.0.0.1:7450), not a %s", path, top.Line, kindName(top))
	}
	seen := make(map[string]int, len(top.Content)/2)
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		at := fmt.Sprintf("%s:%d", path, k.Line)
		if k.Kind != yaml.ScalarNode {
			return fmt.Errorf("%s: a key must be a flag name, not a %s", at, kindName(k))
		}
		key := k.Value
		if line, dup := seen[key]; dup {
			return fmt.Errorf("%s: key %q given twice (first on line %d)", at, key, line)
		}
		seen[key] = k.Line
		if why, ok := notInFile[key]; ok {
			return fmt.Errorf("%s: key %q not allowed in a config file: %s", at, key, why)
		}
		f := fs.Lookup(key)
		if f == nil {
			return fmt.Errorf("%s: unknown key %q%s (keys are dlockd's long flag names; see dlockd --help)", at, key, suggest(fs, key))
		}
		if vv := deref(v); (vv.Kind == yaml.SequenceNode || vv.Kind == yaml.MappingNode) && !listFlag(f) {
			return fmt.Errorf("%s: key %q takes one value (%s), not a %s", at, key, f.Value.Type(), kindName(vv))
		}
		val, err := flagValue(v)
		if err != nil {
			return fmt.Errorf("%s: key %q: %w", at, key, err)
		}
		if f.Changed { // the command line wins
			continue
		}
		if err := fs.SetAnnotation(key, configAt, []string{at, val}); err != nil {
			return fmt.Errorf("%s: key %q: %w", at, key, err)
		}
		if err := fs.Set(key, val); err != nil {
			msg := err.Error()
			if _, after, ok := strings.Cut(msg, " flag: "); ok { // pflag's "invalid argument %q for %q flag: "
				msg = after
			}
			if f.Value.Type() == "bool" {
				msg = "want true or false"
			}
			return fmt.Errorf("%s: key %q: bad value %q: %s", at, key, val, oneLine(msg))
		}
	}
	return nil
}

// configAt is the annotation applyConfigFile puts on each flag it sets:
// the file and line of the key ("path:line") and the value as the file
// gives it, for errors found later.
const configAt = "dlockd-config-at"

// badValue is the one-line error of a flag whose value dlockd refuses
// after parsing (a negative size, an unknown level): "--name value: want"
// when it came from the command line, or, from the config file, the file's
// own form: "path:line: key "name": bad value "value": want".
func badValue(fs *pflag.FlagSet, name, want string) string {
	f := fs.Lookup(name)
	if at := f.Annotations[configAt]; len(at) == 2 {
		return fmt.Sprintf("dlockd: %s: key %q: bad value %q: %s", at[0], name, at[1], want)
	}
	if f.Value.Type() == "string" {
		return fmt.Sprintf("dlockd: --%s %q: %s", name, f.Value.String(), want)
	}
	return fmt.Sprintf("dlockd: --%s %s: %s", name, f.Value.String(), want)
}

// readConfigFile reads path, at most maxConfigBytes of it.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, pe.Err // the caller names the path
		}
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) { // a directory: "read ...: is a directory"
			return nil, pe.Err
		}
		return nil, err
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("more than the %d bytes a config file may have", maxConfigBytes)
	}
	return data, nil
}

// listFlag reports whether f takes a list of values (a comma-separated
// list on the command line): a pflag slice, or a flag whose type reads
// "...,..." (initial-cluster's "id=host:port,...").
func listFlag(f *pflag.Flag) bool {
	if _, ok := f.Value.(pflag.SliceValue); ok {
		return true
	}
	return strings.HasSuffix(f.Value.Type(), ",...")
}

// deref returns the node an alias points at, or v.
func deref(v *yaml.Node) *yaml.Node {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		return v.Alias
	}
	return v
}

// flagValue returns the command-line form of a YAML value: a scalar as it
// is, a list of scalars joined with commas, a mapping of scalars as
// k=v,k=v. Null and nested collections are errors.
func flagValue(v *yaml.Node) (string, error) {
	if v.Kind == yaml.AliasNode {
		v = v.Alias
	}
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return "", errors.New("no value (remove the key, or give one)")
		}
		return v.Value, nil
	case yaml.SequenceNode:
		items := make([]string, 0, len(v.Content))
		for _, it := range v.Content {
			if it.Kind != yaml.ScalarNode || it.Tag == "!!null" {
				return "", fmt.Errorf("line %d: a list item must be a plain value, not a %s", it.Line, kindName(it))
			}
			items = append(items, it.Value)
		}
		return strings.Join(items, ","), nil
	case yaml.MappingNode:
		items := make([]string, 0, len(v.Content)/2)
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, x := v.Content[i], v.Content[i+1]
			if k.Kind != yaml.ScalarNode || x.Kind != yaml.ScalarNode || x.Tag == "!!null" {
				return "", fmt.Errorf("line %d: a mapping value must map plain names to plain values (n1: 10.0.0.1:7451)", k.Line)
			}
			items = append(items, k.Value+"="+x.Value)
		}
		return strings.Join(items, ","), nil
	}
	return "", fmt.Errorf("unsupported value (%s)", kindName(v))
}

// kindName names a YAML node's kind for an error.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return "plain value"
	case yaml.AliasNode:
		return "alias"
	}
	return "document"
}

// suggest returns `; did you mean "x"?` for a key that is a flag name with
// underscores, a leading "--" or capitals, else "".
func suggest(fs *pflag.FlagSet, key string) string {
	c := strings.ToLower(strings.ReplaceAll(strings.TrimLeft(key, "-"), "_", "-"))
	if c != key && fs.Lookup(c) != nil {
		return fmt.Sprintf("; did you mean %q?", c)
	}
	return ""
}

// oneLine joins a multi-line message into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
