package driver_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/driver"
)

// TestLookup_NamesThePackageOfTheSchemeAsked: the "no driver" error names
// the package that registers the scheme asked (it always suggested
// redisdriver), and for a scheme no driver of this module serves, lists
// the schemes that are. Both are ErrInvalidArgument.
func TestLookup_NamesThePackageOfTheSchemeAsked(t *testing.T) {
	for scheme, pkg := range map[string]string{
		"zk":         "github.com/dlock-dev/dlock/drivers/zkdriver",
		"etcd":       "github.com/dlock-dev/dlock/drivers/etcddriver",
		"postgresql": "github.com/dlock-dev/dlock/drivers/pgdriver",
		"dlockd":     "github.com/dlock-dev/dlock/drivers/dlockddriver",
	} {
		_, err := driver.Lookup(scheme)
		if err == nil || !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), `import _ "`+pkg+`"`) {
			t.Errorf("Lookup(%q) = %v: want ErrInvalidArgument naming %s", scheme, err, pkg)
		}
		if strings.Contains(err.Error(), "redisdriver") {
			t.Errorf("Lookup(%q) = %v: suggests another store's driver", scheme, err)
		}
	}
	_, err := driver.Lookup("http")
	if err == nil || !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "dlockd") || !strings.Contains(err.Error(), "redlock") {
		t.Errorf("Lookup(\"http\") = %v: want ErrInvalidArgument listing this module's schemes", err)
	}
	if got := driver.ModulePackage("nope"); got != "" {
		t.Errorf("ModulePackage(\"nope\") = %q, want \"\"", got)
	}
}
