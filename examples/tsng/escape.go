package tsng

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable returns s safe to write to a terminal: every control or
// non-printable character (terminal escapes, newlines, invalid UTF-8) is
// written as a Go escape such as \x1b, everything else as is. The CLI
// passes every member-written string (names, errors that quote them)
// through it; the agent already refuses such names on merge, but a store
// or an agent of another build may still hold one.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n <= 1) || !unicode.IsPrint(r) {
			q := strconv.QuoteToASCII(s[i : i+n])
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
