package vip

import (
	"fmt"
	"slices"
	"strings"
)

// Candidate is one thing a selector can name: a network, a service or a
// node, with its id (lowercase hex) and name.
type Candidate struct {
	ID   string
	Name string
}

func (c Candidate) String() string {
	short := c.ID
	if len(short) > 12 {
		short = short[:12]
	}
	if c.Name == "" {
		return short
	}
	return c.Name + " (" + short + ")"
}

// Resolve picks the one candidate that sel names, by these rules in order:
//
//  1. a full id (case-insensitive);
//  2. an exact name;
//  3. a unique id prefix (at least one hex digit).
//
// A rule that matches several candidates stops the search with an
// AmbiguousError listing them; nothing matched gives ErrNotFound. kind is
// "network", "service" or "node", for messages. Candidates are returned in
// the order given.
func Resolve(kind, sel string, cands []Candidate) (Candidate, error) {
	if sel == "" {
		return Candidate{}, fmt.Errorf("%w: empty %s selector", ErrInvalid, kind)
	}
	low := strings.ToLower(sel)
	match := func(pred func(Candidate) bool) []Candidate {
		var out []Candidate
		for _, c := range cands {
			if pred(c) {
				out = append(out, c)
			}
		}
		return out
	}
	rules := []func(Candidate) bool{
		func(c Candidate) bool { return c.ID != "" && strings.EqualFold(c.ID, sel) },
		func(c Candidate) bool { return c.Name != "" && c.Name == sel },
		func(c Candidate) bool { return isHex(low) && c.ID != "" && strings.HasPrefix(c.ID, low) },
	}
	for _, r := range rules {
		m := match(r)
		switch len(m) {
		case 0:
			continue
		case 1:
			return m[0], nil
		default:
			slices.SortFunc(m, func(a, b Candidate) int { return strings.Compare(a.ID, b.ID) })
			return Candidate{}, &AmbiguousError{Kind: kind, Selector: sel, Candidates: m}
		}
	}
	return Candidate{}, fmt.Errorf("%w: no %s matches %q", ErrNotFound, kind, sel)
}

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
