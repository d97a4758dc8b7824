package zititest

import (
	"errors"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
)

// StartTest is Start for a test or benchmark: without management.yml it
// skips t (through testenv.Skip, so that VIPKIT_REQUIRE_ALL=1 fails it), on
// any other error it fails t, and when t ends it closes the fake and
// reports each of the fake's BadAnswers as an error of t.
func StartTest(t testing.TB, o Options) *Fake {
	t.Helper()
	f, err := Start(o)
	if errors.Is(err, ErrNoSpec) {
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
