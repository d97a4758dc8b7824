package tsng

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
	"unicode/utf8"
)

// helpWidth is the terminal width every help text fits.
const helpWidth = 80

// TestHelpFits80Columns: `--help` of every command and command group, the
// root included, prints no line longer than 80 columns, and still names
// every subcommand and flag.
func TestHelpFits80Columns(t *testing.T) {
	var paths [][]string
	var walk func(cmd *command, path []string)
	walk = func(cmd *command, path []string) {
		paths = append(paths, path)
		for _, s := range cmd.sub {
			walk(s, append(append([]string{}, path...), s.name))
		}
	}
	root := rootCommand()
	walk(root, nil)
	if len(paths) < 30 {
		t.Fatalf("walked %d commands; the tree has more", len(paths))
	}
	for _, p := range paths {
		var out, errb bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
		args := append(append([]string{}, p...), "--help")
		if code := Main(context.Background(), args, env); code != ExitOK || !strings.Contains(out.String(), "Usage:") {
			t.Errorf("tsng %s: exit %d %q", strings.Join(args, " "), code, errb.String())
			continue
		}
		if strings.Contains(out.String(), "\t") {
			t.Errorf("tsng %s: a tab in the help (its width depends on the terminal)", strings.Join(args, " "))
		}
		for i, line := range strings.Split(out.String(), "\n") {
			if n := utf8.RuneCountInString(line); n > helpWidth {
				t.Errorf("tsng %s: line %d is %d columns:\n%s", strings.Join(args, " "), i+1, n, line)
			}
		}
		// Wrapping loses nothing: each subcommand and flag is still named.
		cmd := root
		for _, name := range p {
			for _, s := range cmd.sub {
				if s.name == name {
					cmd = s
				}
			}
		}
		for _, s := range cmd.sub {
			if !strings.Contains(out.String(), "\n  "+s.name+" ") {
				t.Errorf("tsng %s: subcommand %s not listed", strings.Join(args, " "), s.name)
			}
		}
		if cmd.flags != nil {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			cmd.flags(fs, &opts{})
			fs.VisitAll(func(f *flag.Flag) {
				if !strings.Contains(out.String(), "\n  --"+f.Name) {
					t.Errorf("tsng %s: flag --%s not listed", strings.Join(args, " "), f.Name)
				}
			})
		}
	}
}

// TestWrapText: wrapping breaks at spaces within the width, keeps each
// line's indent on its continuations, and leaves a word longer than the
// width whole on its own line.
func TestWrapText(t *testing.T) {
	for _, c := range []struct {
		in    string
		width int
		want  string
	}{
		{"short", 20, "short"},
		{"one two three four", 9, "one two\nthree\nfour"},
		{"  indented words wrap here", 14, "  indented\n  words wrap\n  here"},
		{"a averyveryverylongword b", 8, "a\naveryveryverylongword\nb"},
		{"para one\n\npara two", 20, "para one\n\npara two"},
		{"exactly ten", 11, "exactly ten"},
		{"exactly ten", 10, "exactly\nten"},
		{"", 10, ""},
	} {
		if got := wrapText(c.in, c.width); got != c.want {
			t.Errorf("wrapText(%q, %d) = %q, want %q", c.in, c.width, got, c.want)
		}
	}
}
