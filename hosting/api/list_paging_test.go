package api_test

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
)

// TestListOffsetPastTheEnd: a list at an offset at or past the count,
// up to the largest offset, answers an empty page with the count and no
// next link; an offset over the largest is a 400 that says so.
func TestListOffsetPastTheEnd(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(acct, "a1")
	for i := range 3 {
		if _, err := e.svc.Create(t.Context(), hosting.Share{AccountID: acct, Name: fmt.Sprint("s", i), Kind: hosting.KindTCP, TargetAddress: "10.0.0.9", TargetPort: 80},
			hosting.Update{Active: hosting.Of("a1")}); err != nil {
			t.Fatal(err)
		}
	}
	const col = "/v1/accounts/" + acct + "/tcp-shares"
	for _, c := range []struct {
		offset, limit int
		shares        int
		next          string
	}{
		{1, 1, 1, col + "?limit=1&offset=2"},
		{2, 1000, 1, ""},
		{3, 1, 0, ""},
		{4, 1000, 0, ""},
		{math.MaxInt - 1000, 1000, 0, ""},
		{math.MaxInt - 999, 1000, 0, ""},
		{math.MaxInt - 1, 1, 0, ""},
		{math.MaxInt - 1, 2, 0, ""},
		{math.MaxInt, 1, 0, ""},
		{math.MaxInt, 999, 0, ""},
		{math.MaxInt, 1000, 0, ""},
	} {
		a := e.do("GET", fmt.Sprintf("%s?offset=%d&limit=%d", col, c.offset, c.limit), "", nil)
		if a.status != 200 {
			t.Fatalf("offset %d limit %d: %d %s", c.offset, c.limit, a.status, a.body)
		}
		var l api.ListView
		if err := json.Unmarshal(a.body, &l); err != nil {
			t.Fatal(err)
		}
		next := ""
		if l.Links.Next != nil {
			next = l.Links.Next.Href
		}
		if l.Count != 3 || l.Offset != c.offset || l.Limit != c.limit || len(l.Embedded.Shares) != c.shares || next != c.next {
			t.Fatalf("offset %d limit %d: count %d offset %d limit %d, %d shares, next %q; want %d shares, next %q",
				c.offset, c.limit, l.Count, l.Offset, l.Limit, len(l.Embedded.Shares), next, c.shares, c.next)
		}
	}
	a := e.do("GET", col+"?offset=9223372036854775808", "", nil)
	if p := a.problem(t); a.status != 400 || p.Detail != "api: bad query: offset 9223372036854775808 is over 9223372036854775807" {
		t.Fatalf("offset over the largest: %d %+v", a.status, p)
	}
}
