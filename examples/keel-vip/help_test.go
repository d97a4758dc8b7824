package keelvip_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/internal/clihelp"
)

// helpCommands are keel-vip's commands; TestHelpWidth also checks that
// the top-level help lists each and no other.
var helpCommands = [][]string{{"keygen"}, {"tend"}, {"check"}, {"pair", "propose"}, {"pair", "sign"}, {"promote"},
	{"status"}, {"inspect"}, {"allocate"}, {"render"}, {"drop-all"}}

// TestHelpWidth: the help of keel-vip and of each of its commands exits 0,
// goes to stdout, and fits 80 columns (a tab counts to the next multiple
// of 8), with every flag described.
func TestHelpWidth(t *testing.T) {
	all := append([][]string{{"--help"}, {"pair", "--help"}}, helpCommands...)
	for i, args := range all {
		if i >= 2 {
			args = append(append([]string{}, args...), "--help")
		}
		var out, errb bytes.Buffer
		code := keelvip.Main(context.Background(), args, &out, &errb)
		if code != keelvip.ExitOK || out.Len() == 0 || errb.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out.String(), errb.String())
			continue
		}
		for n, line := range strings.Split(out.String(), "\n") {
			if w := clihelp.Columns(line); w > 80 {
				t.Errorf("%v: line %d is %d columns:\n%s", args, n+1, w, line)
			}
		}
		if i == 0 {
			for _, c := range helpCommands {
				if !strings.Contains(out.String(), "\n  "+strings.Join(c, " ")+" ") {
					t.Errorf("keel-vip --help does not list %q:\n%s", strings.Join(c, " "), out.String())
				}
			}
		}
	}
}
