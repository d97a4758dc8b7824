package clihelp

import (
	"flag"
	"strings"
	"testing"
)

func TestWrap(t *testing.T) {
	for _, tc := range []struct {
		text          string
		indent, width int
		want          string
	}{
		{"", 2, 20, ""},
		{"one two three", 0, 13, "one two three\n"},  // exactly the width
		{"one two three", 0, 12, "one two\nthree\n"}, // one over
		{"one two three", 4, 11, "    one two\n    three\n"},
		{"averyveryverylongword x", 2, 10, "  averyveryverylongword\n  x\n"}, // too long: whole, alone
		{"a\n\nb", 1, 10, " a\n\n b\n"},
		{"cmd --a X [--out FILE] [--b]", 0, 18, "cmd --a X\n[--out FILE] [--b]\n"}, // no break inside [...]
		{"a ] b", 0, 3, "a ]\nb\n"},                                                // a stray ']' does not glue the rest
	} {
		if got := Wrap(tc.text, tc.indent, tc.width); got != tc.want {
			t.Errorf("Wrap(%q, %d, %d) = %q, want %q", tc.text, tc.indent, tc.width, got, tc.want)
		}
	}
	if got := Hang("usage: x ", "aaa bbb ccc", 4, 15); got != "usage: x aaa\n    bbb ccc\n" {
		t.Errorf("Hang: %q", got)
	}
}

func TestWriteFlagsFits(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.String("children", "spawn", strings.Repeat("a long description of the flag ", 6))
	fs.Bool("json", false, "print `JSON`")
	var b strings.Builder
	WriteFlags(&b, fs)
	if l := Check(b.String()); l != "" {
		t.Errorf("line over %d columns: %q", Width, l)
	}
	if strings.Contains(b.String(), "\t") || !strings.Contains(b.String(), `(default "spawn")`) || !strings.Contains(b.String(), "  -json JSON\n      print JSON\n") {
		t.Errorf("WriteFlags:\n%s", b.String())
	}
}

func TestColumns(t *testing.T) {
	if Columns("\tx") != 9 || Columns("abc\tx") != 9 || Columns("é") != 1 {
		t.Error("Columns")
	}
	if Check(strings.Repeat("x", 80)) != "" || Check(strings.Repeat("x", 81)) == "" || Check("\t"+strings.Repeat("x", 73)) == "" {
		t.Error("Check at 80, 81 and with a tab")
	}
}
