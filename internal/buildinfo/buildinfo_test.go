package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestString(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/vipkit/vipkit", Version: "v0.4.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}}}
	if got, want := fromBuildInfo(bi).String(), "v0.4.0 (revision 0123456789ab, 2026-01-02T03:04:05Z, modified; go1.26.0)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := fromBuildInfo(&debug.BuildInfo{}).String(), "(devel) (revision unknown)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if Read().GoVersion == "" {
		t.Error("Read: no Go version in a test binary's build information")
	}
}
