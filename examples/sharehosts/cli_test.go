package sharehosts_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/examples/sharehosts"
	"github.com/vipkit/vipkit/internal/clihelp"
)

// sharehostsCommands are sharehosts' commands; TestHelp also checks that
// the top-level help lists each.
var sharehostsCommands = []string{"serve", "check-config", "demo"}

// TestHelp: --help, -h and help print the usage to stdout and exit 0; so
// does --help after each command; every line fits 80 columns (a tab
// counts to the next multiple of 8).
func TestHelp(t *testing.T) {
	runs := [][]string{{"--help"}, {"-h"}, {"help"}}
	for _, c := range sharehostsCommands {
		runs = append(runs, []string{c, "--help"}, []string{c, "-h"})
	}
	for _, args := range runs {
		var out, errb bytes.Buffer
		code := sharehosts.Main(context.Background(), args, &out, &errb)
		if code != 0 || out.Len() == 0 || errb.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 0 with the help on stdout", args, code, out.String(), errb.String())
			continue
		}
		for n, line := range strings.Split(out.String(), "\n") {
			if w := clihelp.Columns(line); w > 80 {
				t.Errorf("%v: line %d is %d columns:\n%s", args, n+1, w, line)
			}
		}
		if len(args) == 1 {
			for _, c := range sharehostsCommands {
				if !strings.Contains(out.String(), "\n  "+c) {
					t.Errorf("%v does not list %s:\n%s", args, c, out.String())
				}
			}
		}
	}
	// A bad command line is still a usage error, on stderr.
	for _, args := range [][]string{nil, {"bogus"}, {"serve", "-nope"}, {"check-config", "extra"}} {
		var out, errb bytes.Buffer
		if code := sharehosts.Main(context.Background(), args, &out, &errb); code != 2 || errb.Len() == 0 || out.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 with the reason on stderr", args, code, out.String(), errb.String())
		}
	}
}

// TestVersion: --version prints the module and its build info, as
// keel-vip's and tsng's do (internal/buildinfo).
func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "-version", "version"} {
		var out, errb bytes.Buffer
		code := sharehosts.Main(context.Background(), []string{arg}, &out, &errb)
		if code != 0 || !strings.HasPrefix(out.String(), "sharehosts github.com/vipkit/vipkit ") || !strings.Contains(out.String(), "revision") || errb.Len() != 0 {
			t.Errorf("%s: exit %d, %q %q", arg, code, out.String(), errb.String())
		}
	}
}

// TestREADMEDocumentsCheckConfig: the top-level README shows check-config
// next to serve.
func TestREADMEDocumentsCheckConfig(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "sharehosts check-config -config") {
		t.Error("README.md does not show `sharehosts check-config -config FILE`")
	}
}
