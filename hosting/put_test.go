package hosting_test

import (
	"fmt"
	"testing"

	"github.com/vipkit/vipkit/hosting"
)

// A PUT without activeAgentIds (absent or null) is judged by the first
// validation rule, in the update and in the dry run alike.
func TestPutWithoutActivesReportsTheFirstRule(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, nil)
	want := fmt.Sprint([]hosting.Violation{{Field: "activeAgentIds", Message: hosting.MsgNoActive}})
	for _, body := range []string{`{"passiveAgentIds":["p1"]}`, `{"activeAgentIds":null}`, `{}`} {
		u, err := hosting.DecodeUpdate([]byte(body), hosting.Put)
		if err != nil {
			t.Fatalf("%s: decode: %v", body, err)
		}
		dry := e.svc.DryRun(e.ctx, s.ID, u)
		_, upd := e.svc.Update(e.ctx, s.ID, u)
		if got := fmt.Sprint(violations(dry)); got != want {
			t.Errorf("%s: dry run %v, want %s", body, dry, want)
		}
		if got := fmt.Sprint(violations(upd)); got != want {
			t.Errorf("%s: update %v, want %s", body, upd, want)
		}
	}
}
