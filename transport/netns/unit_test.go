//go:build linux

package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var nameTable = []struct {
	name string
	ok   bool
}{
	{"vk-1-2", true},
	{"vk-123-45-lan", true},
	{"a.b_c-D9", true},
	{"", false},
	{".", false},
	{"..", false},
	{"a/b", false},
	{"a b", false},
	{"é", false},
	{strings.Repeat("x", 64), true},
	{strings.Repeat("x", 65), false},
	{"x\x00", false},
}

func TestCheckName(t *testing.T) {
	for _, c := range nameTable {
		err := checkName(c.name)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalidName)) {
			t.Errorf("checkName(%q) = %v, want ok=%v", c.name, err, c.ok)
		}
	}
}

func TestUniqueName(t *testing.T) {
	a, err := UniqueName("")
	if err != nil {
		t.Fatal(err)
	}
	b, err := UniqueName("lan")
	if err != nil {
		t.Fatal(err)
	}
	pre := fmt.Sprintf("vk-%d-", os.Getpid())
	if a == b || !strings.HasPrefix(a, pre) || !strings.HasPrefix(b, pre) || !strings.HasSuffix(b, "-lan") {
		t.Errorf("UniqueName: %q, %q", a, b)
	}
	for _, n := range []string{a, b} {
		if pid, ok := ownerPID(n); !ok || pid != os.Getpid() {
			t.Errorf("ownerPID(%q) = %d, %v", n, pid, ok)
		}
	}
	if _, err := UniqueName("bad/label"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("bad label: %v", err)
	}
	if _, err := UniqueName(strings.Repeat("x", 60)); !errors.Is(err, ErrInvalidName) {
		t.Errorf("long label: %v", err)
	}
}

var ownerTable = []struct {
	name string
	pid  int
	ok   bool
}{
	{"vk-42-1", 42, true},
	{"vk-42-1-lan", 42, true},
	{"vk-42-1-lan-x", 42, true},
	{"vk-42", 0, false},
	{"vk-42-", 0, false},
	{"vk-42-x", 0, false},
	{"vk--1", 0, false},
	{"vk-0-1", 0, false},
	{"vk--5-1", 0, false},
	{"vk-x-1", 0, false},
	{"vk-01-0", 0, false},
	{"vk-+5-1", 0, false},
	{"vk-5-01", 0, false},
	{"vk-5-+1", 0, false},
	{"other-42-1", 0, false},
	{"vk-99999999999999999999-1", 0, false},
}

func TestOwnerPID(t *testing.T) {
	for _, c := range ownerTable {
		pid, ok := ownerPID(c.name)
		if pid != c.pid || ok != c.ok {
			t.Errorf("ownerPID(%q) = %d, %v; want %d, %v", c.name, pid, ok, c.pid, c.ok)
		}
	}
}

// FuzzOwnerPID checks that the sweep's name parser never accepts a name
// that UniqueName could not have made for that pid, and never panics.
func FuzzOwnerPID(f *testing.F) {
	for _, c := range ownerTable {
		f.Add(c.name)
	}
	f.Fuzz(func(t *testing.T, name string) {
		pid, ok := ownerPID(name)
		if !ok {
			if pid != 0 {
				t.Fatalf("ownerPID(%q) = %d, false", name, pid)
			}
			return
		}
		// Accepted names are exactly what UniqueName makes for that pid:
		// vk-<pid>-<n>[-label], in canonical decimals.
		rest := strings.TrimPrefix(name, NamePrefix+strconv.Itoa(pid)+"-")
		n, _, _ := strings.Cut(rest, "-")
		seq, err := strconv.ParseUint(n, 10, 64)
		if pid <= 0 || rest == name || err != nil || strconv.FormatUint(seq, 10) != n {
			t.Fatalf("ownerPID(%q) = %d", name, pid)
		}
	})
}

// FuzzCheckName checks checkName against a naive model.
func FuzzCheckName(f *testing.F) {
	for _, c := range nameTable {
		f.Add(c.name)
	}
	f.Fuzz(func(t *testing.T, name string) {
		model := name != "" && name != "." && name != ".." && len(name) <= maxNameLen
		for i := 0; i < len(name); i++ {
			if !strings.ContainsRune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.", rune(name[i])) {
				model = false
			}
		}
		if err := checkName(name); (err == nil) != model {
			t.Fatalf("checkName(%q) = %v, model says ok=%v", name, err, model)
		}
	})
}

func TestTailBuffer(t *testing.T) {
	var b tailBuffer
	b.Write([]byte("hello "))
	b.Write([]byte("world"))
	if out, tr := b.snapshot(); string(out) != "hello world" || tr {
		t.Fatalf("%q %v", out, tr)
	}
	big := bytes.Repeat([]byte("0123456789"), outputCap/10+5)
	b.Write(big)
	out, tr := b.snapshot()
	if len(out) != outputCap || !tr || !bytes.Equal(out, big[len(big)-outputCap:]) {
		t.Fatalf("after big write: len %d truncated %v", len(out), tr)
	}
	var c tailBuffer
	for range outputCap/1000 + 10 {
		c.Write(bytes.Repeat([]byte{'x'}, 999))
		c.Write([]byte{'\n'})
	}
	out, tr = c.snapshot()
	if len(out) != outputCap || !tr || out[len(out)-1] != '\n' {
		t.Fatalf("after many writes: len %d truncated %v", len(out), tr)
	}
	// A model: the buffer is always the tail of everything written.
	var d tailBuffer
	var all []byte
	for i := range 3000 {
		p := bytes.Repeat([]byte{byte('a' + i%26)}, i%500)
		d.Write(p)
		all = append(all, p...)
		if i%97 != 0 {
			continue
		}
		got, tr := d.snapshot()
		want := all[max(0, len(all)-outputCap):]
		if !bytes.Equal(got, want) || tr != (len(all) > outputCap) {
			t.Fatalf("write %d: tail differs (%d vs %d bytes, truncated %v)", i, len(got), len(want), tr)
		}
	}
}

func TestPool(t *testing.T) {
	var p pool
	seen := map[int]bool{}
	for range maxSubnets {
		k, err := p.get()
		if err != nil || seen[k] {
			t.Fatalf("get: %d, %v (seen %v)", k, err, seen[k])
		}
		seen[k] = true
	}
	if _, err := p.get(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("get from a full pool: %v, want ErrExhausted", err)
	}
	p.put(17)
	if k, err := p.get(); err != nil || k != 17 {
		t.Fatalf("get after put(17) = %d, %v", k, err)
	}
}

func TestAddressPlan(t *testing.T) {
	a4, a6 := subnet(LinkPrefix4, LinkPrefix6, 3, 1)
	if a4 != netip.MustParsePrefix("198.18.3.1/24") || a6 != netip.MustParsePrefix("fd00:18:0:3::1/64") {
		t.Errorf("link subnet 3 host 1: %v %v", a4, a6)
	}
	b4, b6 := subnet(LANPrefix4, LANPrefix6, 255, 254)
	if b4 != netip.MustParsePrefix("198.19.255.254/24") || b6 != netip.MustParsePrefix("fd00:19:0:ff::fe/64") {
		t.Errorf("LAN subnet 255 host 254: %v %v", b4, b6)
	}
	for k := range maxSubnets {
		for _, n := range []int{1, 2, 254} {
			l4, l6 := subnet(LinkPrefix4, LinkPrefix6, k, n)
			w4, w6 := subnet(LANPrefix4, LANPrefix6, k, n)
			if !LinkPrefix4.Contains(l4.Addr()) || !LinkPrefix6.Contains(l6.Addr()) || !LANPrefix4.Contains(w4.Addr()) || !LANPrefix6.Contains(w6.Addr()) {
				t.Fatalf("subnet %d host %d escapes its range: %v %v %v %v", k, n, l4, l6, w4, w6)
			}
		}
	}
	if OverlayAddr4(1) != netip.MustParsePrefix("100.64.0.1/32") || OverlayAddr4(256) != netip.MustParsePrefix("100.64.1.0/32") {
		t.Errorf("OverlayAddr4: %v %v", OverlayAddr4(1), OverlayAddr4(256))
	}
	if OverlayAddr6(0x10002) != netip.MustParsePrefix("fd00:64::1:2/128") {
		t.Errorf("OverlayAddr6: %v", OverlayAddr6(0x10002))
	}
}

var registerUnitChildren sync.Once

func TestRunChild(t *testing.T) {
	registerUnitChildren.Do(func() {
		RegisterChild("unit-ok", func(_ context.Context, args []string) error {
			if strings.Join(args, ",") != "x,y" {
				return fmt.Errorf("args %q", args)
			}
			return nil
		})
		RegisterChild("unit-err", func(context.Context, []string) error { return errors.New("boom") })
	})
	var stderr bytes.Buffer
	if code := runChild("unit-ok", []string{"-test.run=^$", "--", "x", "y"}, &stderr); code != 0 {
		t.Errorf("ok child: exit %d, %s", code, stderr.String())
	}
	if code := runChild("unit-err", nil, &stderr); code != 1 || !strings.Contains(stderr.String(), "boom") {
		t.Errorf("failing child: exit %d, %q", code, stderr.String())
	}
	if code := runChild("unit-none", nil, &stderr); code != 2 {
		t.Errorf("unknown child: exit %d", code)
	}
	defer func() {
		if recover() == nil {
			t.Error("duplicate RegisterChild did not panic")
		}
	}()
	RegisterChild("unit-ok", func(context.Context, []string) error { return nil })
}
