package keelvip_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/claim"
	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/transport/wg"
)

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func seedKey(n byte) ed25519.PrivateKey {
	var s [32]byte
	for i := range s {
		s[i] = n
	}
	return ed25519.NewKeyFromSeed(s[:])
}

func wgKey(n byte) wg.Key {
	var k wg.Key
	for i := range k {
		k[i] = n
	}
	return k
}

// meshDoc returns a valid mesh file (as a map) for node "a" of a pair
// a/b plus an observer c.
func meshDoc(dir string) map[string]any {
	pb, pc := wgKey(2).PublicKey(), wgKey(3).PublicKey()
	return map[string]any{
		"mesh": "m1", "overlay": "fd00:1::/64",
		"node": map[string]any{"id": "a", "addr": "fd00:1::1:1", "wg_private_key": b64(func() []byte { k := wgKey(1); return k[:] }()),
			"sign_private_key": b64(seedKey(1).Seed())},
		"peers": []any{
			map[string]any{"id": "b", "addr": "fd00:1::1:2", "wg_public_key": b64(pb[:]), "sign_public_key": b64(seedKey(2).Public().(ed25519.PublicKey)),
				"endpoint": "198.18.0.2:51820", "keepalive_s": 25},
			map[string]any{"id": "c", "addr": "fd00:1::2:3", "wg_public_key": b64(pc[:]), "sign_public_key": b64(seedKey(3).Public().(ed25519.PublicKey)),
				"allowed_ips": []string{"10.9.0.0/24"}},
		},
		"appliance": map[string]any{"vip": "fd00:1::1:100", "pair_file": filepath.Join(dir, "pair.rec")},
		"etcd":      map[string]any{"endpoints": []string{"http://[fd00:1::1:1]:2379"}},
	}
}

func encode(t testing.TB, m map[string]any) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseMesh(t *testing.T) {
	m, err := keelvip.ParseMesh(bytes.NewReader(encode(t, meshDoc(t.TempDir()))))
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != "m1" || m.Self.ID != "a" || m.VIP != netip.MustParseAddr("fd00:1::1:100") || len(m.Peers) != 2 ||
		m.Interface != "wg0" || m.MembersPort != claim.DefaultMembersPort || m.Self.ListenPort != 51820 || len(m.Etcd) != 1 {
		t.Fatalf("parsed %+v", m)
	}
	if m.Peers[0].Keepalive.Seconds() != 25 || m.Peers[1].AllowedIPs[0] != netip.MustParsePrefix("10.9.0.0/24") {
		t.Fatalf("peers %+v", m.Peers)
	}
}

// TestParseMeshRefusals: every bad mesh file gets its own error, and a VIP
// that spec validation refuses carries claim's sentinel.
func TestParseMeshRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want error
	}{
		{"unknown field", func(m map[string]any) { m["role"] = "primary" }, keelvip.ErrMesh},
		{"bad mesh id", func(m map[string]any) { m["mesh"] = "Mesh One" }, keelvip.ErrMesh},
		{"ipv4 overlay", func(m map[string]any) { m["overlay"] = "10.0.0.0/8" }, keelvip.ErrMesh},
		{"unmasked overlay", func(m map[string]any) { m["overlay"] = "fd00:1::1/64" }, keelvip.ErrMesh},
		{"self outside overlay", func(m map[string]any) { m["node"].(map[string]any)["addr"] = "fd00:2::1" }, keelvip.ErrMesh},
		{"short wg key", func(m map[string]any) { m["node"].(map[string]any)["wg_private_key"] = "AAAA" }, keelvip.ErrMesh},
		{"zero wg key", func(m map[string]any) { m["node"].(map[string]any)["wg_private_key"] = b64(make([]byte, 32)) }, keelvip.ErrMesh},
		{"repeated peer id", func(m map[string]any) { m["peers"].([]any)[1].(map[string]any)["id"] = "b" }, keelvip.ErrMesh},
		{"repeated peer addr", func(m map[string]any) { m["peers"].([]any)[1].(map[string]any)["addr"] = "fd00:1::1:2" }, keelvip.ErrMesh},
		{"peer is self", func(m map[string]any) { m["peers"].([]any)[1].(map[string]any)["addr"] = "fd00:1::1:1" }, keelvip.ErrMesh},
		{"bad endpoint", func(m map[string]any) { m["peers"].([]any)[0].(map[string]any)["endpoint"] = "0.0.0.0:0" }, keelvip.ErrMesh},
		{"unmasked allowed ip", func(m map[string]any) {
			m["peers"].([]any)[1].(map[string]any)["allowed_ips"] = []string{"10.9.0.1/24"}
		}, keelvip.ErrMesh},
		{"vip outside prefix", func(m map[string]any) { m["appliance"].(map[string]any)["vip"] = "fd00:2::1:100" }, claim.ErrVIPOutsidePrefix},
		{"vip is self", func(m map[string]any) { m["appliance"].(map[string]any)["vip"] = "fd00:1::1:1" }, claim.ErrVIPIsMember},
		{"vip outside region", func(m map[string]any) { m["appliance"].(map[string]any)["vip"] = "fd00:1::5:100" }, claim.ErrVIPOutsideRegion},
		{"vip in peer allowed ips", func(m map[string]any) {
			m["peers"].([]any)[1].(map[string]any)["allowed_ips"] = []string{"fd00:1::1:100/126"}
		}, claim.ErrVIPInPeerAllowedIPs},
		{"vip without pair file", func(m map[string]any) { delete(m["appliance"].(map[string]any), "pair_file") }, keelvip.ErrMesh},
		{"vip and observe", func(m map[string]any) { m["appliance"].(map[string]any)["observe"] = "fd00:1::1:100" }, keelvip.ErrMesh},
		{"etcd not a url", func(m map[string]any) { m["etcd"] = map[string]any{"endpoints": []string{"[fd00:1::1]:2379"}} }, keelvip.ErrMesh},
		{"mtu too small", func(m map[string]any) { m["mtu"] = 1000 }, keelvip.ErrMesh},
		{"bad impairment", func(m map[string]any) { m["impair"] = map[string]any{"loss": 2} }, wg.ErrBadImpairment},
		{"negative timing", func(m map[string]any) { m["timings"] = map[string]any{"renew_ms": -1} }, keelvip.ErrMesh},
		{"long interface", func(m map[string]any) { m["interface"] = "a-very-long-interface" }, keelvip.ErrMesh},
		{"hook not an absolute path", func(m map[string]any) { m["hooks"] = map[string]any{"command": []string{"notify"}} }, keelvip.ErrMesh},
		{"hook timeout too long", func(m map[string]any) {
			m["hooks"] = map[string]any{"command": []string{"/bin/true"}, "timeout_s": 301}
		}, keelvip.ErrMesh},
		{"hook timeout negative", func(m map[string]any) {
			m["hooks"] = map[string]any{"command": []string{"/bin/true"}, "timeout_s": -1}
		}, keelvip.ErrMesh},
		{"hook argument with NUL", func(m map[string]any) { m["hooks"] = map[string]any{"command": []string{"/bin/true", "a\x00b"}} }, keelvip.ErrMesh},
		{"hook with too many arguments", func(m map[string]any) {
			m["hooks"] = map[string]any{"command": append([]string{"/bin/true"}, make([]string, 64)...)}
		}, keelvip.ErrMesh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := meshDoc(t.TempDir())
			tc.edit(m)
			_, err := keelvip.ParseMesh(bytes.NewReader(encode(t, m)))
			if !errors.Is(err, tc.want) || !errors.Is(err, keelvip.ErrMesh) {
				t.Fatalf("err %v, want %v (and ErrMesh)", err, tc.want)
			}
		})
	}
	checkRefusals(t)
	big := bytes.Repeat([]byte(" "), keelvip.MaxMeshFileSize+1)
	if _, err := keelvip.ParseMesh(bytes.NewReader(big)); !errors.Is(err, claim.ErrTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	if _, err := keelvip.ParseMesh(strings.NewReader(string(encode(t, meshDoc(t.TempDir()))) + "{}")); !errors.Is(err, keelvip.ErrMesh) {
		t.Fatalf("trailing data: %v", err)
	}
}

// checkRefusals: a bad checks section is refused with an error naming the
// field at fault.
func checkRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		checks map[string]any
		field  string
	}{
		{"no kind", map[string]any{"interval_ms": 1000}, "checks.exec, checks.tcp or checks.http"},
		{"two kinds", map[string]any{"tcp": "[::1]:80", "http": "http://[::1]/"}, "exclusive"},
		{"exec relative", map[string]any{"exec": []string{"check.sh"}}, "checks.exec[0]"},
		{"exec NUL", map[string]any{"exec": []string{"/bin/true", "a\x00b"}}, "checks.exec[1]"},
		{"tcp no port", map[string]any{"tcp": "localhost"}, "checks.tcp"},
		{"http https", map[string]any{"http": "https://[::1]/"}, "checks.http"},
		{"http user", map[string]any{"http": "http://u:p@[::1]/"}, "checks.http"},
		{"interval too short", map[string]any{"tcp": "[::1]:80", "interval_ms": 99}, "checks.interval_ms"},
		{"interval negative", map[string]any{"tcp": "[::1]:80", "interval_ms": -1}, "checks.interval_ms"},
		{"timeout over interval", map[string]any{"tcp": "[::1]:80", "interval_ms": 1000, "timeout_ms": 1001}, "checks.timeout_ms"},
		{"rise negative", map[string]any{"tcp": "[::1]:80", "rise": -1}, "checks.rise"},
		{"fall too big", map[string]any{"tcp": "[::1]:80", "fall": 101}, "checks.fall"},
		{"min move too long", map[string]any{"tcp": "[::1]:80", "min_move_interval_s": 86401}, "checks.min_move_interval_s"},
		{"unknown field", map[string]any{"tcp": "[::1]:80", "intervall_ms": 1000}, "intervall_ms"},
	} {
		t.Run("checks "+tc.name, func(t *testing.T) {
			m := meshDoc(t.TempDir())
			m["checks"] = tc.checks
			_, err := keelvip.ParseMesh(bytes.NewReader(encode(t, m)))
			if !errors.Is(err, keelvip.ErrMesh) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err %v, want ErrMesh naming %q", err, tc.field)
			}
		})
	}
	m := meshDoc(t.TempDir())
	delete(m, "appliance")
	m["checks"] = map[string]any{"tcp": "[::1]:80"}
	if _, err := keelvip.ParseMesh(bytes.NewReader(encode(t, m))); !errors.Is(err, keelvip.ErrMesh) || !strings.Contains(err.Error(), "appliance.vip") {
		t.Fatalf("checks without a vip: %v", err)
	}
}

// TestParseMeshChecks: a checks section is parsed with its defaults.
func TestParseMeshChecks(t *testing.T) {
	m := meshDoc(t.TempDir())
	m["checks"] = map[string]any{"http": "http://[::1]:8080/healthz"}
	got, err := keelvip.ParseMesh(bytes.NewReader(encode(t, m)))
	if err != nil {
		t.Fatal(err)
	}
	// The defaults, as literals (docs/defaults.md).
	want := keelvip.Checks{HTTP: "http://[::1]:8080/healthz", Interval: 2 * time.Second, Timeout: time.Second,
		Rise: 2, Fall: 3, MinMoveInterval: 60 * time.Second}
	if c := got.Checks; c.HTTP != want.HTTP || c.Interval != want.Interval || c.Timeout != want.Timeout || c.Rise != want.Rise || c.Fall != want.Fall || c.MinMoveInterval != want.MinMoveInterval || c.Kind() != "http" {
		t.Fatalf("checks %+v, want %+v", c, want)
	}
	if got.Checks.MaxResultAge() != 5*time.Second {
		t.Fatalf("max result age %v", got.Checks.MaxResultAge())
	}
	m["checks"] = map[string]any{}
	if got, err := keelvip.ParseMesh(bytes.NewReader(encode(t, m))); err != nil || got.Checks.Enabled() {
		t.Fatalf("empty checks: %v %+v", err, got.Checks)
	}
}

func TestLoadMeshInsecure(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mesh.json")
	if err := os.WriteFile(p, encode(t, meshDoc(dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := keelvip.LoadMesh(p); !errors.Is(err, keelvip.ErrInsecureFile) {
		t.Fatalf("0644 mesh file: %v", err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := keelvip.LoadMesh(p); err != nil {
		t.Fatal(err)
	}
}

func FuzzParseMesh(f *testing.F) {
	f.Add(encode(f, meshDoc("/tmp")))
	f.Add([]byte(`{"mesh":"m1"}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := keelvip.ParseMesh(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, keelvip.ErrMesh) {
				t.Fatalf("error without ErrMesh: %v", err)
			}
			return
		}
		// A valid mesh renders, and its own device config shows no drift.
		var sb strings.Builder
		if err := m.Render(&sb, m.VIP, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
		if d := m.Drift(m.WGConfig(), m.VIP); len(d) != 0 {
			t.Fatalf("drift of its own config: %v", d)
		}
	})
}

func mustMesh(t *testing.T) *keelvip.Mesh {
	m, err := keelvip.ParseMesh(bytes.NewReader(encode(t, meshDoc(t.TempDir()))))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRender(t *testing.T) {
	m := mustMesh(t)
	var sb strings.Builder
	holder := netip.MustParseAddr("fd00:1::1:2")
	if err := m.Render(&sb, m.VIP, holder); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	for _, want := range []string{"[Interface]", "ListenPort = 51820", "Address = fd00:1::1:1/128", "# b\n", "Endpoint = 198.18.0.2:51820",
		"AllowedIPs = fd00:1::1:2/128, fd00:1::1:100/128", "PersistentKeepalive = 25", "AllowedIPs = 10.9.0.0/24, fd00:1::2:3/128"} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "fd00:1::1:100/128") != 1 {
		t.Errorf("the VIP must be routed to the holder only:\n%s", out)
	}
	sb.Reset()
	if err := m.Render(&sb, m.VIP, m.Self.Addr); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sb.String(), "fd00:1::1:100") {
		t.Errorf("holder is self: the VIP must be routed to no peer:\n%s", sb.String())
	}
}

// TestDriftIgnoresVIPMoves: the live device read back with the VIP routed
// to any peer is never drift; anything else is.
func TestDriftIgnoresVIPMoves(t *testing.T) {
	m := mustMesh(t)
	vip := netip.PrefixFrom(m.VIP, 128)
	for i := range m.Peers {
		live := m.WGConfig()
		live.Peers[i].AllowedIPs = append(live.Peers[i].AllowedIPs, vip)
		live = live.Normalize()
		if d := m.Drift(live, m.VIP); len(d) != 0 {
			t.Fatalf("VIP routed to peer %d reported as drift: %v", i, d)
		}
	}
	live := m.WGConfig()
	live.Peers[0].AllowedIPs = append(live.Peers[0].AllowedIPs, netip.MustParsePrefix("fd00:1::9:9/128"))
	if d := m.Drift(live.Normalize(), m.VIP); len(d) != 1 || !strings.Contains(d[0], "allowed ips") {
		t.Fatalf("another /128 is drift: %v", d)
	}
	live = m.WGConfig()
	live.Peers = live.Peers[:1]
	live.ListenPort = 1
	if d := m.Drift(live, m.VIP); len(d) != 2 {
		t.Fatalf("missing peer and port: %v", d)
	}
}

// TestPairCommands runs pair propose on a and pair sign on b through the
// CLI, then checks the record, and the refusals of sign.
func TestPairCommands(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	docA := meshDoc(dir)
	// b's mesh file: the mirror of a's.
	pa := wgKey(1).PublicKey()
	docB := meshDoc(dir)
	docB["node"] = map[string]any{"id": "b", "addr": "fd00:1::1:2", "wg_private_key": b64(func() []byte { k := wgKey(2); return k[:] }()), "sign_private_key": b64(seedKey(2).Seed())}
	docB["peers"].([]any)[0] = map[string]any{"id": "a", "addr": "fd00:1::1:1", "wg_public_key": b64(pa[:]), "sign_public_key": b64(seedKey(1).Public().(ed25519.PublicKey))}
	docB["appliance"] = map[string]any{"vip": "fd00:1::1:100", "pair_file": filepath.Join(dir, "pair-b.rec")}
	write := func(name string, doc map[string]any) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, encode(t, doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ma, mb := write("a.json", docA), write("b.json", docB)
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := keelvip.Main(context.Background(), args, &out, &errb)
		return code, out.String() + errb.String()
	}
	prop := filepath.Join(dir, "prop")
	if code, out := run("pair", "propose", "--mesh", ma, "--peer", "fd00:1::1:2", "--out", prop); code != 0 {
		t.Fatal(out)
	}
	if code, out := run("pair", "sign", "--mesh", mb, "--in", prop); code != 0 || !strings.Contains(out, "complete") {
		t.Fatalf("%d %s", code, out)
	}
	mB, err := keelvip.LoadMesh(mb)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := keelvip.LoadPair(mB)
	if err != nil {
		t.Fatal(err)
	}
	if len(pr.Sigs) != 2 || pr.VIP != mB.VIP {
		t.Fatalf("record %+v", pr)
	}
	// c (not a member) proposing with a non-peer, and a sign on the wrong node.
	if code, out := run("pair", "propose", "--mesh", ma, "--peer", "fd00:1::7:7", "--out", prop); code == 0 || !strings.Contains(out, "not a peer") {
		t.Fatalf("propose with a stranger: %d %s", code, out)
	}
	if code, out := run("pair", "sign", "--mesh", ma, "--in", filepath.Join(dir, "pair-b.rec"), "--out", filepath.Join(dir, "x")); code != 0 {
		t.Fatalf("a re-signs its own record: %d %s", code, out)
	}
	tampered := filepath.Join(dir, "tampered")
	raw, _ := os.ReadFile(filepath.Join(dir, "pair-b.rec"))
	rb, _ := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
	rb[len(rb)-1] ^= 1
	os.WriteFile(tampered, []byte(b64(rb)), 0o644)
	if code, out := run("pair", "sign", "--mesh", mb, "--in", tampered); code == 0 || !strings.Contains(out, "signature") {
		t.Fatalf("tampered record: %d %s", code, out)
	}
	if code, _ := run("pair"); code != keelvip.ExitUsage {
		t.Fatalf("bare pair: %d", code)
	}
	if code, _ := run("frobnicate"); code != keelvip.ExitUsage {
		t.Fatalf("unknown command: %d", code)
	}
	if code, out := run("status", "--mesh", ma); code == 0 || !strings.Contains(out, "not running") {
		t.Fatalf("status without tend: %d %s", code, out)
	}
}

func TestStatusText(t *testing.T) {
	s := keelvip.Status{Mesh: "m1", Node: "a", VIP: "fd00:1::1:100", Role: "primary", Epoch: 3, Holder: "a", Lease: "7f", RenewalAgeMs: 1500, Carried: true, Etcd: true}
	var b strings.Builder
	if err := s.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"role:      primary", "epoch:     3", "fenced:    no", "lease:     7f (renewed 1.5 s ago)", "carried:   yes", "routed to: none", "drift:     none"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	if got, want := s.InspectLine(), "fd00:1::1:100 role=primary epoch=3 holder=a fenced=no carried=yes routed-to=-"; got != want {
		t.Errorf("inspect %q, want %q", got, want)
	}
	b.Reset()
	if err := s.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back keelvip.Status
	if err := json.Unmarshal([]byte(b.String()), &back); err != nil || back.Epoch != 3 || back.Lease != "7f" {
		t.Fatalf("json round trip: %v %+v", err, back)
	}
}

func FuzzParsePairFile(f *testing.F) {
	a, b := seedKey(1), seedKey(2)
	pr, err := claim.NewPairRecord("m1", netip.MustParseAddr("fd00:1::1:100"),
		claim.Member{Addr: netip.MustParseAddr("fd00:1::1:1"), Key: claim.KeyOf(a)},
		claim.Member{Addr: netip.MustParseAddr("fd00:1::1:2"), Key: claim.KeyOf(b)})
	if err != nil {
		f.Fatal(err)
	}
	_ = pr.Sign(a)
	_ = pr.Sign(b)
	good, _ := keelvip.EncodePairFile(pr)
	f.Add(good)
	f.Add([]byte("AAAA\n"))
	f.Add([]byte("%%%"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pr, err := keelvip.ParsePairFile(data)
		if err != nil {
			return
		}
		again, err := keelvip.EncodePairFile(pr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := keelvip.ParsePairFile(again); err != nil {
			t.Fatalf("re-encoded record does not parse: %v", err)
		}
	})
}

func BenchmarkDrift(b *testing.B) {
	for _, peers := range []int{2, 64, 1024} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			doc := meshDoc(b.TempDir())
			var ps []any
			for i := 0; i < peers; i++ {
				k := wgKey(byte(i%250 + 4))
				k[1] = byte(i / 250)
				pub := k.PublicKey()
				ps = append(ps, map[string]any{"id": fmt.Sprintf("p%d", i), "addr": fmt.Sprintf("fd00:1::%x:%x", 3+i/200, i%200+1),
					"wg_public_key": b64(pub[:]), "sign_public_key": b64(seedKey(3).Public().(ed25519.PublicKey))})
			}
			doc["peers"] = ps
			delete(doc, "appliance")
			m, err := keelvip.ParseMesh(bytes.NewReader(encode(b, doc)))
			if err != nil {
				b.Fatal(err)
			}
			live := m.WGConfig()
			vip := netip.MustParseAddr("fd00:1::1:100")
			live.Peers[0].AllowedIPs = append(live.Peers[0].AllowedIPs, netip.PrefixFrom(vip, 128))
			live = live.Normalize()
			b.ReportAllocs()
			for b.Loop() {
				if d := m.Drift(live, vip); len(d) != 0 {
					b.Fatal(d)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(peers), "ns/peer")
		})
	}
}

// TestSpawnNeedsDistinctUsers: spawn mode refuses unset, root or equal
// controller and listener uids, with a message naming the fields; tend
// stops there, before it makes anything.
func TestSpawnNeedsDistinctUsers(t *testing.T) {
	for _, tc := range []struct {
		users map[string]any
		want  string
	}{
		{nil, "users.controller_uid 0, users.listener_uid 0"},
		{map[string]any{"controller_uid": 65534, "listener_uid": 65534}, "are both 65534"},
		{map[string]any{"controller_uid": 1000}, "users.listener_uid 0"},
		{map[string]any{"controller_uid": 1000, "listener_uid": 1001}, ""},
	} {
		dir := t.TempDir()
		doc := meshDoc(dir)
		if tc.users != nil {
			doc["users"] = tc.users
		}
		m, err := keelvip.ParseMesh(bytes.NewReader(encode(t, doc)))
		if err != nil {
			t.Fatal(err)
		}
		err = m.CheckSpawnUsers()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%v: %v", tc.users, err)
			}
			continue
		}
		if !errors.Is(err, keelvip.ErrUsers) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want ErrUsers with %q", tc.users, err, tc.want)
		}
		p := filepath.Join(dir, "mesh.json")
		if err := os.WriteFile(p, encode(t, doc), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		if code := keelvip.Main(context.Background(), []string{"tend", "--mesh", p}, &out, &errb); code != keelvip.ExitError ||
			!strings.Contains(errb.String(), "distinct, non-zero controller_uid and listener_uid") {
			t.Errorf("tend with users %v: exit %d, %q", tc.users, code, errb.String())
		}
	}
}

// TestHelpAndVersion: --help and -h exit 0 on every command, --version
// prints the module version and revision from the build info.
func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"pair", "-h"}, {"tend", "-h"}, {"tend", "--help"},
		{"pair", "propose", "-h"}, {"pair", "sign", "--help"}, {"promote", "-h"}, {"status", "-h"},
		{"inspect", "-h"}, {"render", "-h"}, {"drop-all", "--help"}, {"check", "-h"}} {
		var out, errb bytes.Buffer
		if code := keelvip.Main(context.Background(), args, &out, &errb); code != keelvip.ExitOK || out.Len() == 0 || strings.Contains(errb.String(), "unknown") {
			t.Errorf("%v: exit %d, out %q, err %q", args, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := keelvip.Main(context.Background(), []string{"--version"}, &out, &errb); code != keelvip.ExitOK ||
		!strings.HasPrefix(out.String(), "keel-vip github.com/vipkit/vipkit ") || errb.Len() != 0 {
		t.Errorf("--version: exit %d, %q %q", code, out.String(), errb.String())
	}
	if got := keelvip.Version(); !strings.Contains(out.String(), got) {
		t.Errorf("--version %q, Version() %q", out.String(), got)
	}
}

// TestCheckTimings: `keel-vip check` passes the defaults and the spec's
// figures, and fails, naming the rule, a timing that keeps 0 < renew <
// drop < TTL but no margin (10 s renewals, a 10.5 s drop). Such a file
// still parses: tend only warns.
func TestCheckTimings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timings map[string]any
		code    int
		want    string
	}{
		{"defaults", nil, keelvip.ExitOK, "ok"},
		{"spec figures", map[string]any{"renew_ms": 2000, "lease_ttl_ms": 20000, "drop_after_ms": 10000, "election_timeout_ms": 5000}, keelvip.ExitOK, "ok"},
		{"one renewal per drop", map[string]any{"renew_ms": 10000, "drop_after_ms": 10500}, keelvip.ExitError, "want at least 3"},
		{"no room for an election", map[string]any{"renew_ms": 1000, "lease_ttl_ms": 12000, "drop_after_ms": 10000}, keelvip.ExitError, "election timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			doc := meshDoc(dir)
			if tc.timings != nil {
				doc["timings"] = tc.timings
			}
			p := filepath.Join(dir, "mesh.json")
			if err := os.WriteFile(p, encode(t, doc), 0o600); err != nil {
				t.Fatal(err)
			}
			m, err := keelvip.LoadMesh(p)
			if err != nil {
				t.Fatalf("a mesh file valid before no longer parses: %v", err)
			}
			if err := m.CheckTimings(); (err == nil) != (tc.code == keelvip.ExitOK) || err != nil && !errors.Is(err, claim.ErrTimingMargin) {
				t.Errorf("CheckTimings: %v", err)
			}
			var out, errb bytes.Buffer
			code := keelvip.Main(context.Background(), []string{"check", "--mesh", p}, &out, &errb)
			if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.want) {
				t.Errorf("check: exit %d, out %q, err %q; want %d with %q", code, out.String(), errb.String(), tc.code, tc.want)
			}
		})
	}
}
