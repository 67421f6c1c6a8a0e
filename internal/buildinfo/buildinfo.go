// Package buildinfo describes the running binary: its module version, the
// VCS revision it was built from and the Go toolchain, as recorded by the Go
// linker (runtime/debug.ReadBuildInfo). dlockd --version, dlock version and
// dlockd's dlockd_build_info metric all read it here, so they always agree.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Info is what the Go toolchain recorded about the build.
type Info struct {
	// Version is the main module's version: a tag such as "v1.2.0", a
	// pseudo-version, "(devel)" for a build from a working tree without VCS
	// stamping, or "unknown" when the binary carries no build information.
	Version string `json:"version"`
	// Revision is the VCS revision (the full commit hash) the binary was
	// built from, or "" when the build was not VCS-stamped (go build
	// -buildvcs=false, go run of a single file, tests outside a checkout).
	Revision string `json:"revision"`
	// Modified reports whether the working tree had uncommitted changes
	// when the binary was built (vcs.modified).
	Modified bool `json:"modified"`
	// Go is the toolchain version, e.g. "go1.26.0".
	Go string `json:"go"`
	// Platform is GOOS/GOARCH of the binary, e.g. "linux/amd64".
	Platform string `json:"platform"`
}

// version and revision, when set by the linker, override what the Go
// toolchain recorded, for release builds made without VCS stamping:
//
//	go build -ldflags "-X github.com/dlock-dev/dlock/internal/buildinfo.version=v1.2.0 \
//	  -X github.com/dlock-dev/dlock/internal/buildinfo.revision=$(git rev-parse HEAD)" ./cmd/...
var version, revision string

// Read returns the running binary's build information. It never fails: a
// binary without build information reports Version "unknown" and the Go
// version of the runtime.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	i := fromBuildInfo(bi, ok)
	if version != "" {
		i.Version = version
	}
	if revision != "" {
		i.Revision = revision
	}
	return i
}

func fromBuildInfo(bi *debug.BuildInfo, ok bool) Info {
	i := Info{Version: "unknown", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if !ok || bi == nil {
		return i
	}
	if bi.Main.Version != "" {
		i.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		i.Go = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Revision = s.Value
		case "vcs.modified":
			i.Modified = s.Value == "true"
		}
	}
	return i
}

// ShortRevision returns the first 12 characters of Revision (all of it when
// shorter), or "" when the build was not VCS-stamped.
func (i Info) ShortRevision() string {
	if len(i.Revision) > 12 {
		return i.Revision[:12]
	}
	return i.Revision
}

// String formats i as the one line of the dlock CLI (dlock version); it is
// Line("dlock").
func (i Info) String() string { return i.Line("dlock") }

// Line formats i as one line naming program, the same for every dlock
// binary but for that name:
//
//	dlock v1.2.0 (revision 0123456789ab, modified) go1.26.0 linux/amd64
//	dlockd v1.2.0 (revision 0123456789ab, modified) go1.26.0 linux/amd64
//
// The parenthesis says "revision unknown" when the build was not
// VCS-stamped (go build -buildvcs=false, or outside a checkout), and leaves
// out ", modified" when the working tree was clean.
func (i Info) Line(program string) string {
	var b strings.Builder
	b.WriteString(program)
	b.WriteString(" ")
	b.WriteString(i.Version)
	if i.Revision != "" {
		b.WriteString(" (revision ")
		b.WriteString(i.ShortRevision())
		if i.Modified {
			b.WriteString(", modified")
		}
		b.WriteString(")")
	} else {
		b.WriteString(" (revision unknown)")
	}
	b.WriteString(" ")
	b.WriteString(i.Go)
	b.WriteString(" ")
	b.WriteString(i.Platform)
	return b.String()
}
