package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestInfo_String(t *testing.T) {
	plat := runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{"no build info", nil, false, "dlock unknown (revision unknown) " + runtime.Version() + " " + plat},
		{"tagged, clean", &debug.BuildInfo{
			GoVersion: "go1.26.0",
			Main:      debug.Module{Version: "v1.2.0"},
			Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
				{Key: "vcs.modified", Value: "false"},
			},
		}, true, "dlock v1.2.0 (revision 0123456789ab) go1.26.0 " + plat},
		{"devel, modified", &debug.BuildInfo{
			GoVersion: "go1.26.0",
			Main:      debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
				{Key: "vcs.modified", Value: "true"},
			},
		}, true, "dlock (devel) (revision 0123456789ab, modified) go1.26.0 " + plat},
		{"not stamped", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}, true,
			"dlock (devel) (revision unknown) go1.26.0 " + plat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuildInfo(tc.bi, tc.ok).String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRead_OneLineWithGoVersion(t *testing.T) {
	s := Read().String()
	if strings.Contains(s, "\n") || !strings.HasPrefix(s, "dlock ") || !strings.Contains(s, runtime.Version()) {
		t.Fatalf("Read().String() = %q: want one line starting with \"dlock \" naming %s", s, runtime.Version())
	}
}

func TestInfo_LineNamesProgram(t *testing.T) {
	i := Info{Version: "v1.2.0", Revision: "0123456789abcdef", Go: "go1.26.0", Platform: "linux/amd64"}
	if got, want := i.Line("dlockd"), "dlockd v1.2.0 (revision 0123456789ab) go1.26.0 linux/amd64"; got != want {
		t.Fatalf("Line(dlockd) = %q, want %q", got, want)
	}
	if i.String() != i.Line("dlock") {
		t.Fatalf("String() %q != Line(dlock) %q", i.String(), i.Line("dlock"))
	}
}
