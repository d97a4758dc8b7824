package api

import (
	"errors"
	"math"
	"net/url"
	"strconv"
	"testing"
)

// checkPage checks paging and pageBounds on one query against the rules
// of docs/hosting-api.md, computed here without the arithmetic of the
// code under test.
func checkPage(t *testing.T, offset, limit string, n int) {
	t.Helper()
	q := url.Values{}
	if offset != "" {
		q.Set("offset", offset)
	}
	if limit != "" {
		q.Set("limit", limit)
	}
	// What the query means: absent parameters take their defaults.
	wantOff, offErr := int64(0), error(nil)
	if offset != "" {
		wantOff, offErr = strconv.ParseInt(offset, 10, 64)
	}
	wantLim, limErr := int64(DefaultPageLimit), error(nil)
	if limit != "" {
		wantLim, limErr = strconv.ParseInt(limit, 10, 64)
	}
	valid := offErr == nil && limErr == nil && wantOff >= 0 && wantLim >= 1 && wantLim <= MaxPageLimit
	l, o, err := paging(q)
	if !valid {
		if !errors.Is(err, errQuery) {
			t.Fatalf("offset %q limit %q: %d, %d, %v; want a bad query", offset, limit, o, l, err)
		}
		return
	}
	if err != nil || int64(o) != wantOff || int64(l) != wantLim {
		t.Fatalf("offset %q limit %q: offset %d limit %d %v", offset, limit, o, l, err)
	}
	lo, hi, more := pageBounds(n, o, l)
	// The page starts at the offset or, past the end, is empty at the end.
	wantLo := uint64(n)
	if uint64(o) < uint64(n) {
		wantLo = uint64(o)
	}
	wantLen := min(uint64(l), uint64(n)-wantLo)
	if uint64(lo) != wantLo || uint64(hi)-uint64(lo) != wantLen || lo < 0 || hi < lo || hi > n {
		t.Fatalf("offset %d limit %d of %d: page [%d, %d), want [%d, +%d)", o, l, n, lo, hi, wantLo, wantLen)
	}
	if more != (hi < n) {
		t.Fatalf("offset %d limit %d of %d: page [%d, %d) more %v", o, l, n, lo, hi, more)
	}
	// The next page starts after this one: it makes progress and its
	// offset is offset+limit (which, then, fits in an int).
	if more && (hi <= o || uint64(hi) != uint64(o)+uint64(l)) {
		t.Fatalf("offset %d limit %d of %d: next page at %d", o, l, n, hi)
	}
}

// TestPagingBounds: offsets and limits at and around their bounds and
// around the largest int, where offset+limit would overflow.
func TestPagingBounds(t *testing.T) {
	big := strconv.Itoa(math.MaxInt)
	offsets := []string{"", "0", "1", "2", "3", "4", "-1",
		strconv.Itoa(math.MaxInt - MaxPageLimit - 1), strconv.Itoa(math.MaxInt - MaxPageLimit), strconv.Itoa(math.MaxInt - 1), big,
		"9223372036854775808", "18446744073709551616", strconv.Itoa(math.MinInt), "x", "1e3"}
	limits := []string{"", "0", "1", "2", strconv.Itoa(MaxPageLimit - 1), strconv.Itoa(MaxPageLimit), strconv.Itoa(MaxPageLimit + 1), big, "9223372036854775808", "-1"}
	for _, o := range offsets {
		for _, l := range limits {
			for _, n := range []int{0, 1, 3, MaxPageLimit + 1} {
				checkPage(t, o, l, n)
			}
		}
	}
	// An offset past the end is an empty page at the end, with no next.
	for _, o := range []int{3, 4, math.MaxInt - MaxPageLimit, math.MaxInt - 1, math.MaxInt} {
		if lo, hi, more := pageBounds(3, o, MaxPageLimit); lo != 3 || hi != 3 || more {
			t.Fatalf("offset %d of 3: [%d, %d) more %v", o, lo, hi, more)
		}
	}
	// An offset over the largest int is refused, and says so.
	if _, _, err := paging(url.Values{"offset": {"9223372036854775808"}}); err == nil || err.Error() != "api: bad query: offset 9223372036854775808 is over 9223372036854775807" {
		t.Fatalf("offset over MaxInt: %v", err)
	}
}

// FuzzPaging checks paging and pageBounds over any offset, limit and
// count (the seeds run as a test; go test -fuzz=FuzzPaging explores).
func FuzzPaging(f *testing.F) {
	for _, s := range []struct {
		offset, limit string
		n             uint16
	}{
		{"", "", 0}, {"0", "1", 1}, {"2", "2", 3}, {"3", "1000", 3},
		{"9223372036854775807", "", 5}, {"9223372036854775807", "1000", 5}, {"9223372036854775806", "1", 5},
		{"9223372036854774807", "1000", 5}, {"9223372036854775808", "1", 5},
		{"-1", "1", 1}, {"1", "1001", 3}, {"1", "0", 3}, {"+3", "007", 10}, {"abc", "", 1}, {" 1", "1 ", 1},
	} {
		f.Add(s.offset, s.limit, s.n)
	}
	f.Fuzz(func(t *testing.T, offset, limit string, n uint16) {
		checkPage(t, offset, limit, int(n))
	})
}
