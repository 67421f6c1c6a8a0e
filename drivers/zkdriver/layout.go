package zkdriver

import (
	"strings"

	"github.com/dlock-dev/dlock/internal/urlparam"
)

// locksDir is the reserved child of the root that holds every key's
// container node: <root>/.locks/<escaped key>/<owner>-<sequence>. Names
// starting with "." are reserved for the driver: escapeKey escapes every
// ".", so no escaped key starts with one, and validateRoot refuses a root
// with a path element starting with ".", so no root can lie inside another
// root's .locks node.
const locksDir = ".locks"

// validateRoot returns an error when a path element of root starts with
// ".". Without this rule the root "/team/.locks/x" would put its nodes
// among the keys of the root "/team".
func validateRoot(root string) error {
	for _, el := range strings.Split(root, "/") {
		if strings.HasPrefix(el, ".") {
			return urlparam.Invalid("zkdriver: root %q: path element %q starts with \".\" (names starting with \".\" are reserved, e.g. %q)",
				root, el, locksDir)
		}
	}
	return nil
}

// locks returns the path of the node that holds every key's container.
func (d *Driver) locks() string { return d.root + "/" + locksDir }
