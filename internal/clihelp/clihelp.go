// Package clihelp formats the command-line help of keel-vip and
// sharehosts to fit a terminal of Width columns: command synopses on their
// own lines and descriptions wrapped at word boundaries, indented with
// spaces (never tabs, whose width depends on the terminal).
package clihelp

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// Width is the number of columns help text fits in.
const Width = 80

// Wrap breaks text into lines of at most width columns, each starting with
// indent spaces, at spaces between words (not inside a bracketed optional
// part such as "[--out FILE]"). A word longer than the room left stays
// whole on its own line. Newlines in text start new lines; blank lines
// are kept. The result ends with a newline unless text is empty.
func Wrap(text string, indent, width int) string {
	return wrap("", text, indent, width)
}

// Hang wraps prefix followed by text like Wrap, the first line starting
// with prefix at column 0 and the others indented by indent: a synopsis
// such as "usage: keel-vip allocate --mesh FILE ..." that needs two lines.
func Hang(prefix, text string, indent, width int) string {
	return wrap(prefix, text, indent, width)
}

// wrap is Wrap with the first line led by first in place of the indent
// when first is not empty.
func wrap(first, text string, indent, width int) string {
	if text == "" {
		return ""
	}
	var b strings.Builder
	pad := strings.Repeat(" ", indent)
	for i, para := range strings.Split(text, "\n") {
		words := groups(strings.Fields(para))
		if len(words) == 0 {
			b.WriteString("\n")
			continue
		}
		lead := pad
		if i == 0 && first != "" {
			lead = first
		}
		b.WriteString(lead + words[0])
		n := Columns(lead + words[0])
		for _, w := range words[1:] {
			if n+1+Columns(w) > width {
				b.WriteString("\n" + pad + w)
				n = indent + Columns(w)
			} else {
				b.WriteString(" " + w)
				n += 1 + Columns(w)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// groups joins the words of an optional part ("[--out", "FILE]") into
// one, so that a synopsis breaks between flags, not inside one.
func groups(words []string) []string {
	var out []string
	depth := 0
	for _, w := range words {
		if depth > 0 {
			out[len(out)-1] += " " + w
		} else {
			out = append(out, w)
		}
		depth += strings.Count(w, "[") - strings.Count(w, "]")
		if depth < 0 {
			depth = 0
		}
	}
	return out
}

// Command is one entry of a command list: its synopsis and what it does.
type Command struct {
	Synopsis string // "tend --mesh FILE"
	Desc     string
}

// WriteCommands writes each command's synopsis indented by two spaces
// (continued at four) and its description below it, wrapped to Width and
// indented by six.
func WriteCommands(w io.Writer, cmds []Command) {
	for _, c := range cmds {
		io.WriteString(w, Hang("  ", c.Synopsis, 4, Width))
		io.WriteString(w, Wrap(c.Desc, 6, Width))
	}
}

// WriteFlags writes fs's flags as flag.PrintDefaults does, with spaces
// instead of tabs and each description wrapped to Width: "  -name VALUE"
// on one line, the description and its default below it, indented by six.
func WriteFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "-" + f.Name
		if name != "" {
			line += " " + name
		}
		io.WriteString(w, Wrap(line, 2, Width))
		if def := f.DefValue; def != "" && def != "false" && def != "0" {
			usage += fmt.Sprintf(" (default %q)", def)
		}
		io.WriteString(w, Wrap(usage, 6, Width))
	})
}

// Check returns the first line of text longer than Width columns (see
// Columns), or "" when every line fits.
func Check(text string) string {
	for _, line := range strings.Split(text, "\n") {
		if Columns(line) > Width {
			return line
		}
	}
	return ""
}

// Columns is the display width of one line: one column a rune, a tab
// reaching the next multiple of 8.
func Columns(line string) int {
	n := 0
	for _, r := range line {
		if r == '\t' {
			n += 8 - n%8
		} else {
			n++
		}
	}
	return n
}
