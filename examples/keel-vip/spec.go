package keelvip

import (
	"bytes"
	"crypto/ed25519"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/jsonx"
)

// ErrVIPDeclared is returned by allocate for a mesh file that already
// declares appliance.vip (or observes a VIP): the pair's VIP is picked
// once, on the primary, and never changed by allocate.
var ErrVIPDeclared = errors.New("keelvip: the mesh file already declares a vip")

// ErrSpec is returned for an emitted spec that cannot be read, or that
// does not come from a peer of this mesh (wrapped with the field at fault).
var ErrSpec = errors.New("keelvip: invalid spec")

// MaxSpecSize bounds an emitted spec, in bytes.
const MaxSpecSize = MaxMeshFileSize

// Spec is a node's spec as `keel-vip inspect --spec FILE` emits it: the
// public part of its mesh file (no private key), with appliance.vip
// written in. The replica's installer reads the primary's spec to learn
// the pair's VIP (`keel-vip allocate --from-spec FILE`), as the primary's
// installer picked it.
type Spec struct {
	Mesh      string        `json:"mesh"`
	Overlay   string        `json:"overlay"`
	Node      SpecNode      `json:"node"`
	Peers     []SpecNode    `json:"peers"`
	Appliance SpecAppliance `json:"appliance"`
	Etcd      []string      `json:"etcd_endpoints,omitempty"`
}

// SpecNode is a node of a Spec: its id, overlay address and public keys.
type SpecNode struct {
	ID         string   `json:"id"`
	Addr       string   `json:"addr"`
	WGKey      string   `json:"wg_public_key"`
	SignKey    string   `json:"sign_public_key"`
	AllowedIPs []string `json:"allowed_ips,omitempty"`
}

// SpecAppliance is the appliance section of a Spec: the VIP the node
// declares, or the one it observes.
type SpecAppliance struct {
	VIP     string `json:"vip,omitempty"`
	Observe string `json:"observe,omitempty"`
}

// Spec returns the node's spec with vip as appliance.vip: the VIP the
// running node tends (`inspect` passes what the helper reports). The
// invalid Addr writes the mesh file's own. An observer's spec names the
// observed VIP instead.
func (m *Mesh) Spec(vip netip.Addr) Spec {
	pub := m.Self.WGKey.PublicKey()
	s := Spec{Mesh: m.ID, Overlay: m.Overlay.String(), Etcd: m.Etcd,
		Node: SpecNode{ID: m.Self.ID, Addr: m.Self.Addr.String(), WGKey: base64.StdEncoding.EncodeToString(pub[:]),
			SignKey: base64.StdEncoding.EncodeToString(m.Self.SignKey.Public().(ed25519.PublicKey))}}
	for _, p := range m.Peers {
		n := SpecNode{ID: p.ID, Addr: p.Addr.String(), WGKey: base64.StdEncoding.EncodeToString(p.WGKey[:]),
			SignKey: base64.StdEncoding.EncodeToString(p.SignKey[:])}
		for _, a := range p.AllowedIPs {
			n.AllowedIPs = append(n.AllowedIPs, a.String())
		}
		s.Peers = append(s.Peers, n)
	}
	switch {
	case m.Observe.IsValid():
		s.Appliance.Observe = m.Observe.String()
	case vip.IsValid():
		s.Appliance.VIP = vip.String()
	case m.VIP.IsValid():
		s.Appliance.VIP = m.VIP.String()
	}
	return s
}

// Encode returns the spec as indented JSON with a final newline.
func (s Spec) Encode() []byte {
	b, _ := json.MarshalIndent(s, "", "  ") // strings and slices only: cannot fail
	return append(b, '\n')
}

// ParseSpec reads an emitted spec (at most MaxSpecSize bytes; unknown
// fields refused). Errors wrap ErrSpec.
func ParseSpec(r io.Reader) (Spec, error) {
	var s Spec
	data, err := jsonx.ReadAll(r, MaxSpecSize)
	if err != nil {
		return s, fmt.Errorf("%w: %w", ErrSpec, err)
	}
	if err := jsonx.Decode(data, &s); err != nil {
		return s, fmt.Errorf("%w: %v", ErrSpec, err)
	}
	return s, nil
}

// VIPFromSpec returns the appliance.vip of s, the spec another member
// emitted, after checking that s is of this mesh and overlay, that it
// comes from a peer of this mesh file with the same signing key, and that
// the VIP passes this node's spec validation (claim.ValidateVIP: inside
// the prefix and this node's /112, not a member's address, outside every
// peer's allowed IPs).
func (m *Mesh) VIPFromSpec(s Spec) (netip.Addr, error) {
	if s.Mesh != m.ID || s.Overlay != m.Overlay.String() {
		return netip.Addr{}, fmt.Errorf("%w: mesh %q overlay %q, this node's are %q %v", ErrSpec, s.Mesh, s.Overlay, m.ID, m.Overlay)
	}
	from, err := netip.ParseAddr(s.Node.Addr)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: node.addr %q", ErrSpec, s.Node.Addr)
	}
	p, ok := m.PeerByAddr(from)
	if !ok || base64.StdEncoding.EncodeToString(p.SignKey[:]) != s.Node.SignKey {
		return netip.Addr{}, fmt.Errorf("%w: node %s (%v) is not a peer with that signing key", ErrSpec, s.Node.ID, from)
	}
	if s.Appliance.VIP == "" {
		return netip.Addr{}, fmt.Errorf("%w: %s declares no appliance.vip", ErrSpec, s.Node.ID)
	}
	vip, err := netip.ParseAddr(s.Appliance.VIP)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: appliance.vip %q", ErrSpec, s.Appliance.VIP)
	}
	if err := claim.ValidateVIP(vip, m.Overlay, m.Self.Addr, m.peerAllowed()); err != nil {
		return netip.Addr{}, fmt.Errorf("%w: appliance.vip: %w", ErrMesh, err)
	}
	return vip, nil
}

// peerAllowed is what spec validation and the allocator keep clear: every
// peer's address /128 and its allowed IPs.
func (m *Mesh) peerAllowed() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range m.Peers {
		out = append(out, netip.PrefixFrom(p.Addr, 128))
		out = append(out, p.AllowedIPs...)
	}
	return out
}

// Reservations returns every address the node knows must not become its
// pair's VIP: its own and its peers' addresses, the VIP it observes, and
// extra (VIPs of other pairs the installer knows of).
func (m *Mesh) Reservations(extra ...netip.Addr) []netip.Addr {
	out := []netip.Addr{m.Self.Addr}
	for _, p := range m.Peers {
		out = append(out, p.Addr)
	}
	if m.Observe.IsValid() {
		out = append(out, m.Observe)
	}
	if m.VIP.IsValid() {
		out = append(out, m.VIP)
	}
	return append(out, extra...)
}

// AllocateVIP picks the pair's VIP as the primary's installer does:
// claim.Allocate in this node's /112, clear of Reservations(extra...) and
// of every peer's allowed IPs, starting at a point rng draws (nil: a
// random one from crypto/rand, so that two pairs of one region do not
// both start from the bottom). A mesh file that already declares or
// observes a VIP is ErrVIPDeclared.
func (m *Mesh) AllocateVIP(rng *rand.Rand, extra ...netip.Addr) (netip.Addr, error) {
	if m.VIP.IsValid() || m.Observe.IsValid() {
		return netip.Addr{}, fmt.Errorf("%w: %v", ErrVIPDeclared, m.Tended())
	}
	if rng == nil {
		var seed [32]byte
		_, _ = crand.Read(seed[:]) // never fails (crypto/rand's contract)
		rng = rand.New(rand.NewChaCha8(seed))
	}
	return claim.Allocate(m.Overlay, m.Self.Addr, m.Reservations(extra...), m.peerAllowed(), rng)
}

// SetMeshVIP writes vip as appliance.vip into the mesh file at path, and
// appliance.pair_file (pairFile, or pair.rec beside the mesh file) when
// the file names none. Every other field is kept. The new file is parsed
// and validated before it replaces the old one (atomically, mode 0600),
// so a refused VIP leaves the file as it was. A file that already
// declares or observes a VIP is ErrVIPDeclared.
func SetMeshVIP(path string, vip netip.Addr, pairFile string) error {
	raw, err := readSmall(path, MaxMeshFileSize)
	if err != nil {
		return err
	}
	old, err := ParseMesh(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	if old.VIP.IsValid() || old.Observe.IsValid() {
		return fmt.Errorf("%w: %v", ErrVIPDeclared, old.Tended())
	}
	var doc map[string]any
	if err := jsonx.Decode(raw, &doc, jsonx.UseNumber); err != nil {
		return fmt.Errorf("%w: %v", ErrMesh, err)
	}
	app, _ := doc["appliance"].(map[string]any)
	if app == nil {
		app = map[string]any{}
	}
	app["vip"] = vip.String()
	if s, _ := app["pair_file"].(string); s == "" {
		if pairFile == "" {
			pairFile = filepath.Join(filepath.Dir(path), "pair.rec")
		}
		app["pair_file"] = pairFile
	}
	doc["appliance"] = app
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("keelvip: mesh file: %w", err)
	}
	out = append(out, '\n')
	if _, err := ParseMesh(bytes.NewReader(out)); err != nil {
		return err
	}
	return writeFileAtomic(path, out, 0o600)
}

// readSpecFile reads the spec at path.
func readSpecFile(path string) (Spec, error) {
	f, err := os.Open(path)
	if err != nil {
		return Spec{}, fmt.Errorf("keelvip: spec: %w", err)
	}
	defer f.Close()
	return ParseSpec(f)
}
