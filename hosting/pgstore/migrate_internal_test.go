package pgstore

import (
	"errors"
	"slices"
	"testing"
)

func TestMigrationsOrdered(t *testing.T) {
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var vs []string
	for _, m := range ms {
		vs = append(vs, m.Version)
	}
	if !slices.Equal(vs, []string{"1.0.13", "1.0.14", "1.0.15", "1.0.16"}) {
		t.Fatalf("versions %v", vs)
	}
	// 1.0.9 sorts before 1.0.13, numerically.
	a, _ := parseName("V1.0.9__a.sql")
	b, _ := parseName("V1.0.13__b.sql")
	if slices.Compare(a.parts, b.parts) >= 0 {
		t.Fatal("numeric order")
	}
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{"V1.0.14__hosts.sql", "V1__x.sql", "V1.0.x__y.sql", "1.0__x.sql", "V1.0.14_hosts.sql", "V1.0.14__.sql"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseName(s)
		if err != nil {
			if !errors.Is(err, ErrMigration) {
				t.Fatal(err)
			}
			return
		}
		if m.Name == "" || len(m.parts) == 0 {
			t.Fatalf("%q parsed to %+v", s, m)
		}
	})
}
