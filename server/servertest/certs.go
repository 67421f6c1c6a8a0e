package servertest

import "github.com/dlock-dev/dlock/internal/testcerts"

// Test certificates (see package internal/testcerts): a CA made by a test,
// leaf certificates it issues, written to files for --tls-cert,
// --peer-cert, ca=FILE and the like.
type (
	// CA is a certificate authority made by a test; see NewCA.
	CA = testcerts.CA
	// Leaf is a certificate and key a CA issued; see CA.Issue.
	Leaf = testcerts.Leaf
	// LeafOptions shape a leaf certificate; see CA.IssueWith.
	LeafOptions = testcerts.LeafOptions
)

// NewCA makes a CA whose subject CN is name (ECDSA P-256, valid from an
// hour ago to a day from now) and writes its certificate to CA.CertFile.
// It fails the test on error.
var NewCA = testcerts.NewCA
