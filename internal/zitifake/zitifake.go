// Package zitifake starts the fake OpenZiti controller of package zititest
// for a test, under vipkit's test-environment rules (package testenv). It
// is a package of its own so that zititest, which a demo binary links,
// does not import package testing.
package zitifake

import (
	"errors"
	"testing"

	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
)

// Start is zititest.Start for a test or benchmark: without management.yml
// it skips t (through testenv.Skip, so that VIPKIT_REQUIRE_ALL=1 fails it),
// on any other error it fails t, and when t ends it closes the fake and
// reports each of the fake's BadAnswers as an error of t.
func Start(t testing.TB, o zititest.Options) *zititest.Fake {
	t.Helper()
	f, err := zititest.Start(o)
	if errors.Is(err, zititest.ErrNoSpec) {
		testenv.Skip(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		for _, err := range f.BadAnswers() {
			t.Errorf("the fake answered outside the specification: %v", err)
		}
	})
	return f
}
