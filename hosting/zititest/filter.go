package zititest

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vipkit/vipkit/hosting/ziti"
)

// ErrFilter means a filter is outside the subset the fake understands.
var ErrFilter = errors.New("zititest: bad filter")

// maxFilterLength bounds a filter, as the controller bounds a query.
const maxFilterLength = 4096

// Clause is one comparison of a filter: Field = Value or Field != Value,
// or, with AnyOf, anyOf(Field) = Value (some element of a list field).
type Clause struct {
	Field string
	AnyOf bool
	Not   bool
	Value string
}

// Filter is a parsed filter: clauses joined by "and". The zero value
// matches everything.
type Filter []Clause

// ParseFilter parses the subset of the controller's filter language
// (ZitiQL) that the fake understands, with ZitiQL's lexical rules:
//
//	filter = clause { WS+ "and" WS+ clause }
//	clause = lhs WS* ( "=" | "!=" ) WS* string
//	lhs    = ident | "anyOf(" ident ")"
//	ident  = part { "." part }, part = letter { letter | "_" }
//	string = '"' { char | '\' ( '"' | '\' ) } '"'   (no control characters)
//
// So a tag key with a dash or a digit cannot be filtered on, as on the
// controller. Anything else is ErrFilter (the controller's INVALID_FILTER).
func ParseFilter(s string) (Filter, error) {
	if len(s) > maxFilterLength {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrFilter, maxFilterLength)
	}
	p := parser{s: s}
	p.ws()
	if p.eof() {
		return nil, nil
	}
	var out Filter
	for {
		c, err := p.clause()
		if err != nil {
			return nil, err
		}
		out = append(out, c)
		before := p.i
		p.ws()
		if p.eof() {
			return out, nil
		}
		if p.i == before || !p.keyword("and") {
			return nil, fmt.Errorf("%w: want \"and\" at offset %d", ErrFilter, p.i)
		}
		if !p.eof() && isWS(p.s[p.i]) {
			p.ws()
		} else {
			return nil, fmt.Errorf("%w: want a clause after \"and\" at offset %d", ErrFilter, p.i)
		}
	}
}

type parser struct {
	s string
	i int
}

func (p *parser) eof() bool { return p.i >= len(p.s) }

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (p *parser) ws() {
	for !p.eof() && isWS(p.s[p.i]) {
		p.i++
	}
}

func (p *parser) keyword(k string) bool {
	if strings.HasPrefix(strings.ToLower(p.s[p.i:]), k) {
		end := p.i + len(k)
		if end < len(p.s) && !isWS(p.s[end]) {
			return false
		}
		p.i = end
		return true
	}
	return false
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func (p *parser) ident() (string, error) {
	start := p.i
	for {
		if p.eof() || !isLetter(p.s[p.i]) {
			return "", fmt.Errorf("%w: want an identifier at offset %d", ErrFilter, p.i)
		}
		for !p.eof() && (isLetter(p.s[p.i]) || p.s[p.i] == '_') {
			p.i++
		}
		if p.eof() || p.s[p.i] != '.' {
			return p.s[start:p.i], nil
		}
		p.i++
	}
}

func (p *parser) clause() (Clause, error) {
	var c Clause
	if len(p.s)-p.i >= 6 && strings.EqualFold(p.s[p.i:p.i+6], "anyOf(") {
		p.i += 6
		c.AnyOf = true
	}
	f, err := p.ident()
	if err != nil {
		return c, err
	}
	c.Field = f
	if c.AnyOf {
		if p.eof() || p.s[p.i] != ')' {
			return c, fmt.Errorf("%w: want ) at offset %d", ErrFilter, p.i)
		}
		p.i++
	}
	p.ws()
	switch {
	case strings.HasPrefix(p.s[p.i:], "!="):
		c.Not = true
		p.i += 2
	case strings.HasPrefix(p.s[p.i:], "="):
		p.i++
	default:
		return c, fmt.Errorf("%w: want = or != at offset %d", ErrFilter, p.i)
	}
	p.ws()
	if p.eof() || p.s[p.i] != '"' {
		return c, fmt.Errorf("%w: want a string at offset %d", ErrFilter, p.i)
	}
	p.i++
	var b strings.Builder
	for {
		if p.eof() {
			return c, fmt.Errorf("%w: unterminated string", ErrFilter)
		}
		ch := p.s[p.i]
		p.i++
		if ch == '"' {
			break
		}
		if ch < 0x20 {
			return c, fmt.Errorf("%w: control character in a string at offset %d", ErrFilter, p.i-1)
		}
		if ch == '\\' {
			if p.eof() || p.s[p.i] != '"' && p.s[p.i] != '\\' {
				return c, fmt.Errorf("%w: bad escape at offset %d", ErrFilter, p.i)
			}
			ch = p.s[p.i]
			p.i++
		}
		b.WriteByte(ch)
	}
	c.Value = b.String()
	return c, nil
}

// mayMatchTags reports whether an object with tags can match f, judging
// only its "tags.k = v" clauses (Match decides).
func (f Filter) mayMatchTags(tags ziti.Tags) bool {
	for _, c := range f {
		if c.AnyOf || c.Not || !strings.HasPrefix(c.Field, "tags.") {
			continue
		}
		if s, _ := tags[strings.TrimPrefix(c.Field, "tags.")].(string); s != c.Value {
			return false
		}
	}
	return true
}

// Match reports whether the JSON object obj (as the fake answers it)
// satisfies every clause. "service" compares serviceId; "tags.k" the tag k.
func (f Filter) Match(obj map[string]any) bool {
	for _, c := range f {
		var v any
		switch {
		case c.Field == "service":
			v = obj["serviceId"]
		case strings.HasPrefix(c.Field, "tags."):
			tags, _ := obj["tags"].(map[string]any)
			v = tags[strings.TrimPrefix(c.Field, "tags.")]
		default:
			v = obj[c.Field]
		}
		var eq bool
		if c.AnyOf {
			switch l := v.(type) {
			case []string:
				for _, e := range l {
					eq = eq || e == c.Value
				}
			case []any:
				for _, e := range l {
					eq = eq || e == c.Value
				}
			}
		} else {
			s, ok := v.(string)
			eq = ok && s == c.Value
		}
		if eq == c.Not {
			return false
		}
	}
	return true
}
