package keelvip_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/claim"
	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
)

// meshDocB is node b's mesh file of meshDoc's pair: peers a and c.
func meshDocB(dir string) map[string]any {
	pa, pc := wgKey(1).PublicKey(), wgKey(3).PublicKey()
	return map[string]any{
		"mesh": "m1", "overlay": "fd00:1::/64",
		"node": map[string]any{"id": "b", "addr": "fd00:1::1:2", "wg_private_key": b64(func() []byte { k := wgKey(2); return k[:] }()),
			"sign_private_key": b64(seedKey(2).Seed())},
		"peers": []any{
			map[string]any{"id": "a", "addr": "fd00:1::1:1", "wg_public_key": b64(pa[:]), "sign_public_key": b64(seedKey(1).Public().(ed25519.PublicKey))},
			map[string]any{"id": "c", "addr": "fd00:1::2:3", "wg_public_key": b64(pc[:]), "sign_public_key": b64(seedKey(3).Public().(ed25519.PublicKey)),
				"allowed_ips": []string{"10.9.0.0/24"}},
		},
		"etcd": map[string]any{"endpoints": []string{"http://[fd00:1::1:1]:2379"}},
	}
}

func writeMesh(t *testing.T, dir, name string, doc map[string]any) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, encode(t, doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func run(args ...string) (int, string) {
	var out, errb bytes.Buffer
	code := keelvip.Main(context.Background(), args, &out, &errb)
	return code, out.String() + errb.String()
}

// The installer flow: the primary allocates the pair's VIP in its /112,
// clear of everything it knows; its emitted spec carries appliance.vip;
// the replica writes the same VIP from that spec. Refusals leave the mesh
// file as it was.
func TestAllocateAndSpec(t *testing.T) {
	dir := t.TempDir()
	docA := meshDoc(dir)
	delete(docA, "appliance")
	pa := writeMesh(t, dir, "a.json", docA)
	if code, out := run("allocate", "--mesh", pa); code != keelvip.ExitOK || !strings.Contains(out, "appliance.vip") {
		t.Fatalf("allocate on a: %d %s", code, out)
	}
	a, err := keelvip.LoadMesh(pa)
	if err != nil {
		t.Fatalf("allocated mesh file: %v", err)
	}
	if !a.VIP.IsValid() || !claim.Region(a.Self.Addr).Contains(a.VIP) || a.PairFile != filepath.Join(dir, "pair.rec") {
		t.Fatalf("allocated vip %v pair file %q", a.VIP, a.PairFile)
	}
	if a.VIP == a.Self.Addr || a.VIP == a.Peers[0].Addr || a.VIP == a.Peers[1].Addr {
		t.Fatalf("vip %v is a member's address", a.VIP)
	}
	if len(a.Etcd) != 1 || len(a.Peers) != 2 {
		t.Fatalf("allocate lost fields: %+v", a)
	}
	before, _ := os.ReadFile(pa)
	if code, out := run("allocate", "--mesh", pa); code != keelvip.ExitError || !strings.Contains(out, "already declares") {
		t.Fatalf("second allocate: %d %s", code, out)
	}
	if after, _ := os.ReadFile(pa); !bytes.Equal(before, after) {
		t.Fatal("refused allocate changed the mesh file")
	}

	// The spec a emits (inspect --spec) names the VIP and no private key.
	spec := a.Spec(netip.Addr{})
	raw := spec.Encode()
	if strings.Contains(string(raw), "private") || spec.Appliance.VIP != a.VIP.String() {
		t.Fatalf("spec %s", raw)
	}
	sp := filepath.Join(dir, "a.spec.json")
	if err := os.WriteFile(sp, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	pb := writeMesh(t, dir, "b.json", meshDocB(dir))
	if code, out := run("allocate", "--mesh", pb, "--from-spec", sp); code != keelvip.ExitOK {
		t.Fatalf("allocate on b from a's spec: %d %s", code, out)
	}
	b, err := keelvip.LoadMesh(pb)
	if err != nil || b.VIP != a.VIP {
		t.Fatalf("b's vip %v, a's %v (%v)", b.VIP, a.VIP, err)
	}

	// Specs b must refuse: another mesh, a node that is not a peer with
	// that key, no VIP, a VIP in a peer's allowed IPs.
	pb2 := writeMesh(t, dir, "b2.json", meshDocB(dir))
	for _, tc := range []struct {
		name string
		edit func(*keelvip.Spec)
		want error
	}{
		{"other mesh", func(s *keelvip.Spec) { s.Mesh = "m2" }, keelvip.ErrSpec},
		{"not a peer key", func(s *keelvip.Spec) { s.Node.SignKey = b64(seedKey(9).Public().(ed25519.PublicKey)) }, keelvip.ErrSpec},
		{"no vip", func(s *keelvip.Spec) { s.Appliance.VIP = "" }, keelvip.ErrSpec},
		{"vip is a member", func(s *keelvip.Spec) { s.Appliance.VIP = "fd00:1::1:1" }, claim.ErrVIPInPeerAllowedIPs},
		{"vip outside the region", func(s *keelvip.Spec) { s.Appliance.VIP = "fd00:1::2:100" }, claim.ErrVIPOutsideRegion},
	} {
		s := spec
		tc.edit(&s)
		m2, _ := keelvip.LoadMesh(pb2)
		if _, err := m2.VIPFromSpec(s); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if code, out := run("allocate", "--mesh", pb2, "--from-spec", filepath.Join(dir, "missing.json")); code != keelvip.ExitError {
		t.Fatalf("allocate from a missing spec: %d %s", code, out)
	}
	if m2, _ := keelvip.LoadMesh(pb2); m2.VIP.IsValid() {
		t.Fatal("a refused spec wrote a vip")
	}
	if _, err := keelvip.ParseSpec(strings.NewReader(`{"mesh":"m1","role":"primary"}`)); !errors.Is(err, keelvip.ErrSpec) {
		t.Fatalf("unknown field: %v", err)
	}
	if back, err := keelvip.ParseSpec(bytes.NewReader(raw)); err != nil || back.Appliance.VIP != spec.Appliance.VIP || len(back.Peers) != 2 {
		t.Fatalf("spec round trip: %+v %v", back, err)
	}
}

// The allocator keeps clear of the reservations the node is given: the
// same start with the first pick reserved picks another address.
func TestAllocateReservations(t *testing.T) {
	dir := t.TempDir()
	doc := meshDoc(dir)
	delete(doc, "appliance")
	m, err := keelvip.ParseMesh(bytes.NewReader(encode(t, doc)))
	if err != nil {
		t.Fatal(err)
	}
	const seed = 7
	first, err := m.AllocateVIP(rand.New(rand.NewPCG(seed, seed)))
	if err != nil {
		t.Fatal(err)
	}
	second, err := m.AllocateVIP(rand.New(rand.NewPCG(seed, seed)), first)
	if err != nil || second == first || !claim.Region(m.Self.Addr).Contains(second) {
		t.Fatalf("seed %d: with %v reserved got %v (%v)", seed, first, second, err)
	}
	for _, a := range m.Reservations(first) {
		if a == second {
			t.Fatalf("seed %d: picked reserved %v", seed, a)
		}
	}
	declared, _ := keelvip.ParseMesh(bytes.NewReader(encode(t, meshDoc(dir))))
	if _, err := declared.AllocateVIP(nil); !errors.Is(err, keelvip.ErrVIPDeclared) {
		t.Fatalf("allocate with a declared vip: %v", err)
	}
}
