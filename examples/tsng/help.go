package tsng

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"
)

// helpWrap is the width help text is wrapped to: a terminal's 80 columns.
const helpWrap = 80

// helpCol is the column at which the command lists of a group's help
// start their descriptions, when the name and arguments fit before it.
const helpCol = 26

// optionLine matches an indented option line such as
// "  --socket PATH  the socket": its continuations align after the gap.
var optionLine = regexp.MustCompile(`^( +\S+(?: \S+)*  +)\S`)

// wrapText wraps s to width columns. Each line keeps its indent on its
// continuation lines, or, for an option line ("  --flag ARG  text"), the
// column of its text. Consecutive unindented lines form a paragraph and
// are joined before wrapping; empty lines stay. A word longer than the
// width stands whole on a line of its own.
func wrapText(s string, width int) string {
	var out []string
	var para []string
	flush := func() {
		if len(para) > 0 {
			out = append(out, wrapLine(strings.Join(para, " "), width, ""))
			para = nil
		}
	}
	for _, line := range strings.Split(s, "\n") {
		switch {
		case line == "":
			flush()
			out = append(out, "")
		case line[0] != ' ':
			para = append(para, line)
		default:
			flush()
			indent := strings.Repeat(" ", len(line)-len(strings.TrimLeft(line, " ")))
			if m := optionLine.FindStringSubmatch(line); m != nil && utf8.RuneCountInString(m[1]) < width/2 {
				indent = strings.Repeat(" ", utf8.RuneCountInString(m[1]))
			}
			out = append(out, wrapLine(line, width, indent))
		}
	}
	flush()
	return strings.Join(out, "\n")
}

// wrapLine wraps one line to width, starting continuation lines with
// indent. Spaces within a line stay as they are (they may align
// columns); a break replaces the spaces it falls on.
func wrapLine(line string, width int, indent string) string {
	words := wordSpan.FindAllStringIndex(line, -1)
	if len(words) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(line[:words[0][1]])
	n := utf8.RuneCountInString(line[:words[0][1]])
	for i, w := range words[1:] {
		gap, word := line[words[i][1]:w[0]], line[w[0]:w[1]]
		gn, wn := utf8.RuneCountInString(gap), utf8.RuneCountInString(word)
		if n+gn+wn > width {
			b.WriteString("\n" + indent + word)
			n = utf8.RuneCountInString(indent) + wn
			continue
		}
		b.WriteString(gap + word)
		n += gn + wn
	}
	return b.String()
}

// wordSpan is a word of help text: anything but spaces.
var wordSpan = regexp.MustCompile(`[^ ]+`)

// writeCommandList prints a group's subcommands: name and arguments, and
// the description from helpCol on, or on the next lines when they reach
// past it.
func writeCommandList(w io.Writer, subs []*command) {
	pad := strings.Repeat(" ", helpCol)
	for _, s := range subs {
		left := "  " + strings.TrimSpace(s.name+" "+s.args)
		if utf8.RuneCountInString(left)+2 <= helpCol {
			left += strings.Repeat(" ", helpCol-utf8.RuneCountInString(left))
			fmt.Fprintln(w, wrapLine(left+s.short, helpWrap, pad))
			continue
		}
		fmt.Fprintln(w, wrapLine(left, helpWrap, "      "))
		fmt.Fprintln(w, wrapLine(pad+s.short, helpWrap, pad))
	}
}

// writeFlags prints fs's flags as "  --name ARG" lines, each followed by
// its usage, wrapped and indented, with its default when it has one.
func writeFlags(w io.Writer, fs *flag.FlagSet) {
	const indent = "        "
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		fmt.Fprintln(w, strings.TrimRight("  --"+f.Name+" "+arg, " "))
		switch f.DefValue {
		case "", "0", "false", "0s", "[]":
		default:
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, wrapLine(indent+usage, helpWrap, indent))
	})
}
