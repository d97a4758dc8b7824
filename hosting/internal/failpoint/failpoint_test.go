package failpoint

import (
	"errors"
	"testing"
)

func TestParseAndEval(t *testing.T) {
	got := parse(" a=error, b=kill ,=x, c, d=")
	if len(got) != 3 || got["a"] != "error" || got["b"] != "kill" || got["d"] != "" {
		t.Fatalf("parse = %v", got)
	}
	if len(parse("")) != 0 {
		t.Fatal("an empty variable enables points")
	}
	saved := points
	defer func() { points = saved }()
	points = map[string]string{"a": "error", "u": "bogus"}
	if err := Eval("a"); !errors.Is(err, ErrInjected) {
		t.Fatalf("error action: %v", err)
	}
	if err := Eval("u"); !errors.Is(err, ErrInjected) {
		t.Fatalf("unknown action: %v", err)
	}
	if err := Eval("off"); err != nil {
		t.Fatalf("a point not enabled: %v", err)
	}
}
