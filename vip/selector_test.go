package vip

import (
	"errors"
	"strings"
	"testing"
)

func TestResolveSelector(t *testing.T) {
	cands := []Candidate{
		{ID: "ab12ff00", Name: "api"},
		{ID: "ab34ee11", Name: "web"},
		{ID: "cd000000", Name: "ab"}, // a name that is also an id prefix of others
		{ID: "ef000000", Name: "dup"},
		{ID: "ef111111", Name: "dup"},
	}
	ok := map[string]string{
		"api":      "ab12ff00", // exact name
		"AB34EE11": "ab34ee11", // full id, any case
		"ab1":      "ab12ff00", // unique prefix
		"cd":       "cd000000",
		"ab":       "cd000000", // an exact name beats an ambiguous prefix
	}
	for sel, want := range ok {
		c, err := Resolve("service", sel, cands)
		if err != nil || c.ID != want {
			t.Errorf("Resolve(%q) = %v, %v; want %s", sel, c, err, want)
		}
	}
	var ae *AmbiguousError
	_, err := Resolve("service", "dup", cands)
	if !errors.As(err, &ae) || len(ae.Candidates) != 2 || !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("duplicate names: %v", err)
	}
	if !strings.Contains(err.Error(), "dup (ef000000)") || !strings.Contains(err.Error(), "dup (ef111111)") {
		t.Fatalf("message does not list candidates: %v", err)
	}
	_, err = Resolve("service", "e", cands)
	if !errors.As(err, &ae) || len(ae.Candidates) != 2 {
		t.Fatalf("ambiguous prefix: %v", err)
	}
	if _, err := Resolve("service", "zz", cands); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}
	if _, err := Resolve("service", "", cands); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty: %v", err)
	}
}
