// Package buildinfo reports what a vipkit binary was built from: its
// module version and VCS revision, from the build information the Go
// toolchain embeds (runtime/debug.ReadBuildInfo). The commands' --version
// flags print it.
//
//	fmt.Println("tsng", buildinfo.Read())
//
// A binary built with `go build` inside a checkout carries the revision
// (unless -buildvcs=false); one built with `go install module@version`
// carries the module version instead.
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Info is a binary's build information.
type Info struct {
	Module    string // main module path
	Version   string // module version, "(devel)" for a checkout build
	Revision  string // VCS revision, "" when not recorded
	Time      string // VCS commit time (RFC 3339), "" when not recorded
	Modified  bool   // the work tree had uncommitted changes
	GoVersion string
}

// Read returns the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown"}
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	i := Info{Module: bi.Main.Path, Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if i.Version == "" {
		i.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Revision = s.Value
		case "vcs.time":
			i.Time = s.Value
		case "vcs.modified":
			i.Modified = s.Value == "true"
		}
	}
	return i
}

// String is the one-line form: "v1.2.3 (revision 0123456789ab, 2026-01-02T03:04:05Z, modified; go1.26.0)".
func (i Info) String() string {
	var b strings.Builder
	b.WriteString(i.Version)
	var parts []string
	if i.Revision != "" {
		rev := i.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		parts = append(parts, "revision "+rev)
	} else {
		parts = append(parts, "revision unknown")
	}
	if i.Time != "" {
		parts = append(parts, i.Time)
	}
	if i.Modified {
		parts = append(parts, "modified")
	}
	b.WriteString(" (" + strings.Join(parts, ", "))
	if i.GoVersion != "" {
		b.WriteString("; " + i.GoVersion)
	}
	b.WriteString(")")
	return b.String()
}
