package servertest

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/dlock-dev/dlock/internal/authtoken"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// Identity is one identity of a test auth file (see server/auth.go): a name,
// the token that proves it (made by WriteAuthFile when empty; "-" for none),
// the client certificate CNs and DNS names that map to it, and its rules
// (key prefix to permissions: "lock", "read", "admin").
type Identity struct {
	Name    string
	Token   string
	CertCN  []string
	CertDNS []string
	Rules   map[string][]string
}

// WriteAuthFile writes ids as a JSON auth file in dir (file name auth.json)
// and returns its path. An identity with an empty Token gets a fresh one
// (authtoken.New), written back into ids so the test can use it; the file
// holds only its hash.
func WriteAuthFile(t testservers.TB, dir string, ids []Identity) string {
	t.Helper()
	type entry struct {
		Name        string              `json:"name"`
		TokenSHA256 []string            `json:"token_sha256,omitempty"`
		CertCN      []string            `json:"cert_cn,omitempty"`
		CertDNS     []string            `json:"cert_dns,omitempty"`
		Rules       map[string][]string `json:"rules"`
	}
	doc := struct {
		Identities []entry `json:"identities"`
	}{}
	for i := range ids {
		id := &ids[i]
		if id.Token == "" {
			tok, err := authtoken.New()
			if err != nil {
				t.Fatal(err)
			}
			id.Token = tok
		}
		e := entry{Name: id.Name, CertCN: id.CertCN, CertDNS: id.CertDNS, Rules: id.Rules}
		if id.Token != "-" {
			e.TokenSHA256 = []string{authtoken.Hash(id.Token)}
		}
		doc.Identities = append(doc.Identities, e)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "auth.json")
	// Written to a temporary name and renamed: a server reloading it never
	// reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}
