package historytest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind (a
// client stream, a proxy connection or a server that was not stopped).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
