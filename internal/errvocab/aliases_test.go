//lint:file-ignore SA1019 this file checks the deprecated names themselves

package errvocab

import (
	"errors"
	"testing"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/hosting/events"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/vip"
)

// aliases pairs each deprecated name with the name that replaces it.
var aliases = []struct {
	name      string
	old, want error
}{
	{"claim.ErrConfig", claim.ErrConfig, claim.ErrInvalidOptions},
	{"crdt.ErrConfig", crdt.ErrConfig, crdt.ErrInvalidOptions},
	{"probe.ErrInvalidConfig", probe.ErrInvalidConfig, probe.ErrInvalidOptions},
	{"vip.ErrEngineOptions", vip.ErrEngineOptions, vip.ErrInvalidOptions},
	{"events.ErrOptions", events.ErrOptions, events.ErrInvalidOptions},
}

// TestDeprecatedAliases: an importer that matches a deprecated name
// matches every error of the new one, and the other way round.
func TestDeprecatedAliases(t *testing.T) {
	for _, a := range aliases {
		if a.old != a.want {
			t.Errorf("%s is not the same value as its replacement", a.name)
		}
		w := errors.Join(errors.New("detail"), a.want)
		o := errors.Join(errors.New("detail"), a.old)
		if !errors.Is(w, a.old) || !errors.Is(o, a.want) {
			t.Errorf("%s: errors.Is does not match both ways", a.name)
		}
	}
}
