package zititest

import (
	"errors"
	"testing"
)

var filterTable = []struct {
	in   string
	want Filter
	err  bool
}{
	{``, nil, false},
	{`name = "x"`, Filter{{Field: "name", Value: "x"}}, false},
	{`tags.frontdoorShareId="a" and tags.frontdoorId = "b"`, Filter{{Field: "tags.frontdoorShareId", Value: "a"}, {Field: "tags.frontdoorId", Value: "b"}}, false},
	{`anyOf(roleAttributes) = "agent | x"`, Filter{{Field: "roleAttributes", AnyOf: true, Value: "agent | x"}}, false},
	{`tags.agent-id = "x"`, nil, true},
	{`tags.k2 = "x"`, nil, true},
	{`name = "x"and id = "y"`, nil, true},
	{`name = "x" and`, nil, true},
	{"name = \"a\tb\"", nil, true},
	{`service != "q\"uote\\"`, Filter{{Field: "service", Not: true, Value: `q"uote\`}}, false},
	{`name ~ "x"`, nil, true},
	{`name = x`, nil, true},
	{`name = "x" or id = "y"`, nil, true},
	{`name = "x`, nil, true},
	{`1name = "x"`, nil, true},
	{`tags. = "x"`, nil, true},
	{`name = "\n"`, nil, true},
}

func TestParseFilter(t *testing.T) {
	for _, tc := range filterTable {
		got, err := ParseFilter(tc.in)
		if (err != nil) != tc.err {
			t.Fatalf("%q: err %v", tc.in, err)
		}
		if err != nil && !errors.Is(err, ErrFilter) {
			t.Fatalf("%q: %v is not ErrFilter", tc.in, err)
		}
		if err == nil && len(got) != len(tc.want) {
			t.Fatalf("%q: got %+v", tc.in, got)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%q: got %+v want %+v", tc.in, got, tc.want)
			}
		}
	}
	obj := map[string]any{"name": "n", "serviceId": "s", "tags": map[string]any{"k": "v", "b": true}, "roleAttributes": []string{"x", "y"}}
	for in, want := range map[string]bool{`anyOf(roleAttributes) = "y"`: true, `anyOf(roleAttributes) = "z"`: false, `anyOf(roleAttributes) != "z"`: true, `name = "n"`: true, `service = "s"`: true, `tags.k = "v"`: true, `tags.k != "v"`: false, `tags.b = "true"`: false, `tags.none != "v"`: true, `name = "n" and tags.k = "w"`: false} {
		f, err := ParseFilter(in)
		if err != nil || f.Match(obj) != want {
			t.Errorf("%s: match %v (%v), want %v", in, f.Match(obj), err, want)
		}
	}
}

func FuzzParseFilter(f *testing.F) {
	for _, tc := range filterTable {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		flt, err := ParseFilter(s)
		if err != nil {
			if !errors.Is(err, ErrFilter) {
				t.Fatalf("%v is not ErrFilter", err)
			}
			return
		}
		// Re-rendering a parsed filter parses to the same clauses.
		var parts []string
		for _, c := range flt {
			op := " = "
			if c.Not {
				op = " != "
			}
			lhs := c.Field
			if c.AnyOf {
				lhs = "anyOf(" + lhs + ")"
			}
			parts = append(parts, lhs+op+quote(c.Value))
		}
		again, err := ParseFilter(join(parts))
		if err != nil || len(again) != len(flt) {
			t.Fatalf("round trip of %q: %v %v", s, again, err)
		}
		for i := range again {
			if again[i] != flt[i] {
				t.Fatalf("round trip of %q: %+v != %+v", s, again[i], flt[i])
			}
		}
		_ = flt.Match(map[string]any{"name": "x", "tags": map[string]any{}})
	})
}

func quote(s string) string {
	out := []byte{'"'}
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			out = append(out, '\\')
		}
		out = append(out, s[i])
	}
	return string(append(out, '"'))
}

func join(parts []string) string {
	s := ""
	for i, p := range parts {
		if i > 0 {
			s += " and "
		}
		s += p
	}
	return s
}
