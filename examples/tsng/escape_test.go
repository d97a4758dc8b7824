package tsng

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/vip"
)

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"api":                     "api",
		"café":                    "café",
		"evil\x1b[2J\x1b]0;x\x07": `evil\x1b[2J\x1b]0;x\a`,
		"two\nlines\r":            `two\nlines\r`,
		"bad\xffutf8":             `bad\xffutf8`,
		"bidi\u202eoverride":      `bidi\u202eoverride`,
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPrintDocEscapes: a service name held with terminal escapes (from a
// store or an agent that did not check it) reaches the terminal escaped.
func TestPrintDocEscapes(t *testing.T) {
	var out bytes.Buffer
	c := &cliCtx{env: &Env{Stdout: &out}}
	d := ServiceDoc{Network: "home\x1b[1m", ServiceView: vip.ServiceView{Service: vip.Service{Name: "evil\x1b[2J"}, Err: "bad \x1b]0;title\x07"}}
	if err := printDoc(c, d); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\x07") {
		t.Fatalf("raw escape in output: %q", out.String())
	}
	if !strings.Contains(out.String(), `evil\x1b[2J.home\x1b[1m`) {
		t.Fatalf("name not shown escaped: %q", out.String())
	}
}
