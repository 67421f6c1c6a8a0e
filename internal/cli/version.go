package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock/internal/buildinfo"
)

// newVersionCmd is dlock version: the build of this binary, as one line
// (the line dlockd --version prints, but for "dlock") or, with -o json, an object with the
// fields of buildinfo.Info.
func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, VCS revision and Go version of this build",
		Long: `Version prints the build of this dlock binary on one line: the module
version, the VCS revision it was built from (marked modified when the working
tree had uncommitted changes; "revision unknown" when the build was not
VCS-stamped, e.g. built with GOFLAGS=-buildvcs=false) and the Go version and platform. dlockd
--version prints the same line for dlockd. With -o json it prints an object:
{"version", "revision", "modified", "go", "platform"}.`,
		Example: `  dlock version
  dlock version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			bi := buildinfo.Read()
			if g.json() {
				g.printJSON(bi)
				return nil
			}
			fmt.Fprintln(g.stdout, bi.String())
			return nil
		},
	}
}
