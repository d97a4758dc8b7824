package keelvip

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/transport/wg"
)

// Errors of the mesh file and the commands. Each is wrapped with the field
// or value at fault; match them with errors.Is.
var (
	// ErrMesh is returned for a mesh file that is not valid: unknown or
	// missing fields, bad keys or addresses, a VIP that spec validation
	// refuses (the claim.ErrVIP* sentinel is wrapped too).
	ErrMesh = errors.New("keelvip: invalid mesh file")
	// ErrInsecureFile is returned for a mesh file or key file that holds a
	// private key and is readable or writable by group or others.
	ErrInsecureFile = errors.New("keelvip: private key file is accessible to group or others")
	// ErrNoVIP is returned by commands that need appliance.vip when the
	// mesh file declares none.
	ErrNoVIP = errors.New("keelvip: the node declares no vip")
	// ErrNotPair is returned by pair sign for a proposal that does not name
	// this node and the declared peer, or names another VIP or mesh.
	ErrNotPair = errors.New("keelvip: pair proposal does not match this node")
	// ErrPeerCred is returned when a process on a private socket is not the
	// one expected (SO_PEERCRED pid or uid mismatch).
	ErrPeerCred = errors.New("keelvip: unexpected peer on private socket")
	// ErrRefused is returned by the root helper for a carrier request whose
	// claim does not check out (wrapping the claim sentinel).
	ErrRefused = errors.New("keelvip: helper refused the request")
	// ErrNotRunning is returned by status, inspect and promote when no
	// helper answers on the admin socket.
	ErrNotRunning = errors.New("keelvip: tend is not running")
	// ErrRunDir is returned by tend for a run_dir (or a directory the
	// helper makes in it) whose owner or mode would let another user in
	// or keep the unprivileged children out; the message names the mode
	// needed.
	ErrRunDir = errors.New("keelvip: unsafe or unusable directory")
	// ErrUsers is returned by tend in spawn mode when users.controller_uid
	// and users.listener_uid are not two distinct, non-zero uids.
	ErrUsers = errors.New("keelvip: spawn mode needs distinct, non-zero controller_uid and listener_uid")
)

// MaxMeshFileSize bounds a mesh file, in bytes.
const MaxMeshFileSize = 1 << 20

// MaxPeers bounds the peers of a mesh file.
const MaxPeers = 1024

// Defaults of a mesh file.
const (
	DefaultInterface  = "wg0"
	DefaultListenPort = 51820
	DefaultRunDir     = "/run/keel-vip"
	DefaultStateDir   = "/var/lib/keel/vip"
	DefaultMTU        = 1420
)

// Mesh is a node's mesh file: the mesh, this node's keys and address, its
// peers, the VIP it declares and the etcd endpoints. Load it with LoadMesh
// or ParseMesh, which validate it; the zero value is not valid. A Mesh is
// read-only after parsing and safe for concurrent reads.
type Mesh struct {
	ID      string       // mesh id (claim's mesh name: a-z 0-9 - .)
	Overlay netip.Prefix // the overlay prefix (IPv6)
	Self    Node         // this node
	Peers   []Peer
	// VIP is appliance.vip: the invalid Addr when the node declares none.
	VIP netip.Addr
	// Observe is the VIP of another pair that this node (a member of
	// neither) follows and routes to its holder; the invalid Addr when
	// none. A node declares a VIP or observes one, not both.
	Observe netip.Addr
	// PairFile is the path of the pair record (pair propose/sign write it).
	PairFile string
	// TrustRoots may sign a pair record in place of a member.
	TrustRoots []claim.PublicKey
	// Etcd are the etcd client URLs; none means the no-etcd mode.
	Etcd []string
	// EtcdTLS names the CA bundle, this member's client certificate and
	// key, and an optional server name for etcd over TLS (EtcdTLSConfig);
	// the zero value is plain http.
	EtcdTLS EtcdTLS
	// Interface is the WireGuard interface (default wg0); MTU its MTU.
	Interface string
	MTU       int
	// MembersPort is the members' channel TCP port (default 9444).
	MembersPort uint16
	// RunDir holds the helper's sockets; StateDir the controller's state.
	RunDir, StateDir string
	// ControllerUID/GID and ListenerUID/GID are the unprivileged ids the
	// helper runs the controller and the members' listener as (spawn
	// mode; under systemd the units' dynamic users). Spawn mode requires
	// two distinct, non-zero uids (ErrUsers); 0 means unset. A gid of 0
	// means 65534 (nogroup).
	ControllerUID, ControllerGID, ListenerUID, ListenerGID uint32
	// Impair impairs every leg this node sends on (tests only).
	Impair wg.Impairment
	// EventLog, when set, is a file the helper appends one line to for
	// every add and remove of a VIP address (CLOCK_BOOTTIME timestamps).
	EventLog string
	// Timings of the controller; zero means claim's defaults.
	RenewInterval, LeaseTTL, DropAfter, ElectionTimeout time.Duration
	// Metrics is the loopback address and port the controller serves its
	// Prometheus metrics on (GET /metrics, docs/keel-vip-metrics.md); the
	// zero value: none. Only a loopback address is accepted.
	Metrics netip.AddrPort
	// Hooks is the command run on each role change (Hooks); the zero
	// value runs none.
	Hooks Hooks
	// Checks is the service check (Checks), its defaults filled in when
	// one is named; the zero value runs none.
	Checks Checks
}

// Node is this node's identity.
type Node struct {
	ID         string
	Addr       netip.Addr // overlay address
	WGKey      wg.Key     // WireGuard private key
	SignKey    ed25519.PrivateKey
	ListenPort uint16
}

// Peer is another node of the mesh.
type Peer struct {
	ID         string
	Addr       netip.Addr // overlay address
	WGKey      wg.Key     // WireGuard public key
	SignKey    claim.PublicKey
	Endpoint   netip.AddrPort // underlay; the zero value: learned when it calls
	AllowedIPs []netip.Prefix // besides Addr/128
	Keepalive  time.Duration
}

// meshFile is the JSON form. Keys are base64 (WireGuard's and Ed25519's
// 32-byte seeds and public keys).
type meshFile struct {
	Mesh    string `json:"mesh"`
	Overlay string `json:"overlay"`
	Node    struct {
		ID         string `json:"id"`
		Addr       string `json:"addr"`
		WGKey      string `json:"wg_private_key"`
		SignKey    string `json:"sign_private_key"`
		ListenPort uint16 `json:"listen_port,omitempty"`
	} `json:"node"`
	Peers []struct {
		ID         string   `json:"id"`
		Addr       string   `json:"addr"`
		WGKey      string   `json:"wg_public_key"`
		SignKey    string   `json:"sign_public_key"`
		Endpoint   string   `json:"endpoint,omitempty"`
		AllowedIPs []string `json:"allowed_ips,omitempty"`
		Keepalive  int      `json:"keepalive_s,omitempty"`
	} `json:"peers"`
	TrustRoots []string `json:"trust_roots,omitempty"`
	Appliance  struct {
		VIP      string `json:"vip,omitempty"`
		PairFile string `json:"pair_file,omitempty"`
		Observe  string `json:"observe,omitempty"`
	} `json:"appliance"`
	Etcd struct {
		Endpoints  []string `json:"endpoints,omitempty"`
		CAFile     string   `json:"ca_file,omitempty"`
		CertFile   string   `json:"cert_file,omitempty"`
		KeyFile    string   `json:"key_file,omitempty"`
		ServerName string   `json:"server_name,omitempty"`
		// The same, inline (PEM): how the helper hands them to the
		// controller it starts, which cannot read root's files.
		CAPEM   string `json:"ca_pem,omitempty"`
		CertPEM string `json:"cert_pem,omitempty"`
		KeyPEM  string `json:"key_pem,omitempty"`
	} `json:"etcd"`
	Interface   string `json:"interface,omitempty"`
	MTU         int    `json:"mtu,omitempty"`
	MembersPort uint16 `json:"members_port,omitempty"`
	RunDir      string `json:"run_dir,omitempty"`
	StateDir    string `json:"state_dir,omitempty"`
	Users       struct {
		ControllerUID uint32 `json:"controller_uid,omitempty"`
		ControllerGID uint32 `json:"controller_gid,omitempty"`
		ListenerUID   uint32 `json:"listener_uid,omitempty"`
		ListenerGID   uint32 `json:"listener_gid,omitempty"`
	} `json:"users"`
	Impair *struct {
		LatencyMs float64 `json:"latency_ms"`
		JitterMs  float64 `json:"jitter_ms"`
		Loss      float64 `json:"loss"`
	} `json:"impair,omitempty"`
	EventLog string `json:"event_log,omitempty"`
	Metrics  string `json:"metrics,omitempty"`
	Hooks    struct {
		Command  []string `json:"command,omitempty"`
		TimeoutS int      `json:"timeout_s,omitempty"`
	} `json:"hooks"`
	Checks struct {
		Exec       []string `json:"exec,omitempty"`
		TCP        string   `json:"tcp,omitempty"`
		HTTP       string   `json:"http,omitempty"`
		IntervalMs int      `json:"interval_ms,omitempty"`
		TimeoutMs  int      `json:"timeout_ms,omitempty"`
		Rise       int      `json:"rise,omitempty"`
		Fall       int      `json:"fall,omitempty"`
		MinMoveS   int      `json:"min_move_interval_s,omitempty"`
	} `json:"checks"`
	Timings struct {
		RenewMs    int `json:"renew_ms,omitempty"`
		TTLMs      int `json:"lease_ttl_ms,omitempty"`
		DropMs     int `json:"drop_after_ms,omitempty"`
		ElectionMs int `json:"election_timeout_ms,omitempty"`
	} `json:"timings"`
}

// LoadMesh reads and validates the mesh file at path. A file that holds
// private keys must not be accessible to group or others (ErrInsecureFile).
func LoadMesh(path string) (*Mesh, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("keelvip: mesh file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("keelvip: mesh file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s is %v", ErrInsecureFile, path, fi.Mode().Perm())
	}
	return ParseMesh(f)
}

// ParseMesh reads the JSON mesh file from r and validates it. Unknown
// fields are refused; every error wraps ErrMesh (and ErrTooLarge's
// equivalent, claim.ErrTooLarge, for a file over MaxMeshFileSize).
func ParseMesh(r io.Reader) (*Mesh, error) {
	data, err := jsonx.ReadAll(r, MaxMeshFileSize)
	if errors.Is(err, jsonx.ErrTooLarge) {
		return nil, fmt.Errorf("%w: %w: over %d bytes", ErrMesh, claim.ErrTooLarge, MaxMeshFileSize)
	}
	if err != nil {
		return nil, fmt.Errorf("keelvip: mesh file: %w", err)
	}
	var mf meshFile
	if err := jsonx.Decode(data, &mf); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMesh, err)
	}
	return mf.mesh()
}

func bad(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMesh}, a...)...)
}

func parseB64Key(field, s string) ([32]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != 32 {
		return [32]byte{}, bad("%s: want 32 bytes of base64", field)
	}
	return [32]byte(b), nil
}

func parseOverlayAddr(field, s string, overlay netip.Prefix) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" {
		return netip.Addr{}, bad("%s: %q is not an IPv6 address", field, s)
	}
	if !overlay.Contains(a) {
		return netip.Addr{}, bad("%s: %v outside the overlay %v", field, a, overlay)
	}
	return a, nil
}

func validMesh(s string) bool {
	if s == "" || len(s) > claim.MaxMeshLen {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func validID(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func (mf *meshFile) mesh() (*Mesh, error) {
	m := &Mesh{ID: mf.Mesh, Interface: mf.Interface, MTU: mf.MTU, MembersPort: mf.MembersPort,
		RunDir: mf.RunDir, StateDir: mf.StateDir, EventLog: mf.EventLog, PairFile: mf.Appliance.PairFile}
	if !validMesh(m.ID) {
		return nil, bad("mesh %q: a-z, 0-9, '-' and '.' only, 1 to %d bytes", m.ID, claim.MaxMeshLen)
	}
	var err error
	if m.Overlay, err = netip.ParsePrefix(mf.Overlay); err != nil || !m.Overlay.Addr().Is6() || m.Overlay.Addr().Is4In6() || m.Overlay != m.Overlay.Masked() || m.Overlay.Bits() > 112 {
		return nil, bad("overlay %q: want a masked IPv6 prefix of /112 or shorter", mf.Overlay)
	}
	n := mf.Node
	if !validID(n.ID) {
		return nil, bad("node.id %q", n.ID)
	}
	m.Self.ID = n.ID
	if m.Self.Addr, err = parseOverlayAddr("node.addr", n.Addr, m.Overlay); err != nil {
		return nil, err
	}
	k, err := parseB64Key("node.wg_private_key", n.WGKey)
	if err != nil {
		return nil, err
	}
	if m.Self.WGKey = wg.Key(k); m.Self.WGKey.IsZero() {
		return nil, bad("node.wg_private_key is zero")
	}
	seed, err := parseB64Key("node.sign_private_key", n.SignKey)
	if err != nil {
		return nil, err
	}
	m.Self.SignKey = ed25519.NewKeyFromSeed(seed[:])
	m.Self.ListenPort = n.ListenPort
	if m.Self.ListenPort == 0 {
		m.Self.ListenPort = DefaultListenPort
	}
	if len(mf.Peers) > MaxPeers {
		return nil, bad("%d peers, at most %d", len(mf.Peers), MaxPeers)
	}
	ids := map[string]bool{m.Self.ID: true}
	addrs := map[netip.Addr]bool{m.Self.Addr: true}
	wgKeys := map[wg.Key]bool{m.Self.WGKey.PublicKey(): true}
	for i, p := range mf.Peers {
		f := fmt.Sprintf("peers[%d]", i)
		if !validID(p.ID) || ids[p.ID] {
			return nil, bad("%s.id %q missing, invalid or repeated", f, p.ID)
		}
		ids[p.ID] = true
		q := Peer{ID: p.ID, Keepalive: time.Duration(p.Keepalive) * time.Second}
		if q.Addr, err = parseOverlayAddr(f+".addr", p.Addr, m.Overlay); err != nil {
			return nil, err
		}
		if addrs[q.Addr] {
			return nil, bad("%s.addr %v repeated", f, q.Addr)
		}
		addrs[q.Addr] = true
		if k, err = parseB64Key(f+".wg_public_key", p.WGKey); err != nil {
			return nil, err
		}
		if q.WGKey = wg.Key(k); q.WGKey.IsZero() || wgKeys[q.WGKey] {
			return nil, bad("%s.wg_public_key zero or repeated", f)
		}
		wgKeys[q.WGKey] = true
		if k, err = parseB64Key(f+".sign_public_key", p.SignKey); err != nil {
			return nil, err
		}
		q.SignKey = claim.PublicKey(k)
		if p.Endpoint != "" {
			if q.Endpoint, err = netip.ParseAddrPort(p.Endpoint); err != nil || q.Endpoint.Port() == 0 || q.Endpoint.Addr().IsUnspecified() || q.Endpoint.Addr().IsMulticast() {
				return nil, bad("%s.endpoint %q", f, p.Endpoint)
			}
		}
		if p.Keepalive < 0 || p.Keepalive > 65535 {
			return nil, bad("%s.keepalive_s %d", f, p.Keepalive)
		}
		for _, s := range p.AllowedIPs {
			a, err := netip.ParsePrefix(s)
			if err != nil || a != a.Masked() {
				return nil, bad("%s.allowed_ips: %q is not a masked prefix", f, s)
			}
			q.AllowedIPs = append(q.AllowedIPs, a)
		}
		m.Peers = append(m.Peers, q)
	}
	for i, s := range mf.TrustRoots {
		k, err := parseB64Key(fmt.Sprintf("trust_roots[%d]", i), s)
		if err != nil {
			return nil, err
		}
		m.TrustRoots = append(m.TrustRoots, claim.PublicKey(k))
	}
	if mf.Appliance.VIP != "" {
		v, err := netip.ParseAddr(mf.Appliance.VIP)
		if err != nil {
			return nil, bad("appliance.vip %q", mf.Appliance.VIP)
		}
		var allowed []netip.Prefix
		for _, p := range m.Peers {
			allowed = append(allowed, netip.PrefixFrom(p.Addr, 128))
			allowed = append(allowed, p.AllowedIPs...)
		}
		if err := claim.ValidateVIP(v, m.Overlay, m.Self.Addr, allowed); err != nil {
			return nil, fmt.Errorf("%w: appliance.vip: %w", ErrMesh, err)
		}
		m.VIP = v
		if m.PairFile == "" {
			return nil, bad("appliance.pair_file is required with appliance.vip")
		}
	}
	if mf.Appliance.Observe != "" {
		v, err := netip.ParseAddr(mf.Appliance.Observe)
		if err != nil || !v.Is6() || v.Is4In6() || v.Zone() != "" || !m.Overlay.Contains(v) {
			return nil, bad("appliance.observe %q: want an IPv6 address in the overlay", mf.Appliance.Observe)
		}
		if m.VIP.IsValid() {
			return nil, bad("appliance.observe and appliance.vip are exclusive")
		}
		if v == m.Self.Addr || addrs[v] {
			return nil, fmt.Errorf("%w: appliance.observe: %w: %v", ErrMesh, claim.ErrVIPIsMember, v)
		}
		m.Observe = v
	}
	for i, e := range mf.Etcd.Endpoints {
		if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
			return nil, bad("etcd.endpoints[%d] %q: want an http(s) URL", i, e)
		}
	}
	m.Etcd = slices.Clone(mf.Etcd.Endpoints)
	e := mf.Etcd
	m.EtcdTLS = EtcdTLS{CAFile: e.CAFile, CertFile: e.CertFile, KeyFile: e.KeyFile, ServerName: e.ServerName,
		CAPEM: []byte(e.CAPEM), CertPEM: []byte(e.CertPEM), KeyPEM: []byte(e.KeyPEM)}
	if m.EtcdTLS.Enabled() {
		for i, ep := range m.Etcd {
			if !strings.HasPrefix(ep, "https://") {
				return nil, bad("etcd.endpoints[%d] %q: etcd over TLS needs https:// endpoints", i, ep)
			}
		}
		if (e.CertFile == "") != (e.KeyFile == "") || (e.CertPEM == "") != (e.KeyPEM == "") {
			return nil, bad("etcd.cert_file and etcd.key_file go together")
		}
	}
	if m.Interface == "" {
		m.Interface = DefaultInterface
	}
	if len(m.Interface) > 15 || strings.ContainsAny(m.Interface, "/ \t\n") {
		return nil, bad("interface %q", m.Interface)
	}
	if m.MTU == 0 {
		m.MTU = DefaultMTU
	}
	if m.MTU < 1280 || m.MTU > 65535 {
		return nil, bad("mtu %d: IPv6 needs 1280 to 65535", m.MTU)
	}
	if m.MembersPort == 0 {
		m.MembersPort = claim.DefaultMembersPort
	}
	if m.RunDir == "" {
		m.RunDir = DefaultRunDir
	}
	if m.StateDir == "" {
		m.StateDir = DefaultStateDir
	}
	u := mf.Users
	m.ControllerUID, m.ControllerGID, m.ListenerUID, m.ListenerGID = u.ControllerUID, orNobody(u.ControllerGID), u.ListenerUID, orNobody(u.ListenerGID)
	if mf.Impair != nil {
		m.Impair = wg.Impairment{Latency: ms(mf.Impair.LatencyMs), Jitter: ms(mf.Impair.JitterMs), Loss: mf.Impair.Loss}
		if err := m.Impair.Validate(); err != nil {
			return nil, fmt.Errorf("%w: impair: %w", ErrMesh, err)
		}
	}
	t := mf.Timings
	if t.RenewMs < 0 || t.TTLMs < 0 || t.DropMs < 0 || t.ElectionMs < 0 {
		return nil, bad("timings: negative")
	}
	m.RenewInterval, m.LeaseTTL = time.Duration(t.RenewMs)*time.Millisecond, time.Duration(t.TTLMs)*time.Millisecond
	m.DropAfter, m.ElectionTimeout = time.Duration(t.DropMs)*time.Millisecond, time.Duration(t.ElectionMs)*time.Millisecond
	if mf.Metrics != "" {
		ap, err := netip.ParseAddrPort(mf.Metrics)
		if err != nil || ap.Port() == 0 || !ap.Addr().IsLoopback() || ap.Addr().Zone() != "" {
			return nil, bad("metrics %q: want a loopback address and port, such as 127.0.0.1:9445", mf.Metrics)
		}
		m.Metrics = ap
	}
	m.Hooks = Hooks{Command: mf.Hooks.Command, Timeout: time.Duration(mf.Hooks.TimeoutS) * time.Second}
	if mf.Hooks.TimeoutS < 0 {
		m.Hooks.Timeout = -1
	}
	if err := m.Hooks.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMesh, err)
	}
	c := mf.Checks
	m.Checks = Checks{Exec: c.Exec, TCP: c.TCP, HTTP: c.HTTP, Interval: time.Duration(c.IntervalMs) * time.Millisecond,
		Timeout: time.Duration(c.TimeoutMs) * time.Millisecond, Rise: c.Rise, Fall: c.Fall, MinMoveInterval: time.Duration(c.MinMoveS) * time.Second}
	if m.Checks.Enabled() {
		m.Checks = m.Checks.withDefaults()
		if !m.VIP.IsValid() {
			return nil, bad("checks: needs appliance.vip (only a member of the pair carries the VIP)")
		}
	}
	if err := m.Checks.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMesh, err)
	}
	return m, nil
}

func orNobody(id uint32) uint32 {
	if id == 0 {
		return 65534
	}
	return id
}

func ms(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }

// Tended returns the VIP the node's controller tends: the declared VIP,
// else the observed one, else the invalid Addr.
func (m *Mesh) Tended() netip.Addr {
	if m.VIP.IsValid() {
		return m.VIP
	}
	return m.Observe
}

// PeerByAddr returns the peer whose overlay address is a.
func (m *Mesh) PeerByAddr(a netip.Addr) (Peer, bool) {
	for _, p := range m.Peers {
		if p.Addr == a {
			return p, true
		}
	}
	return Peer{}, false
}

// Trust returns the trust store the mesh file implies: this node and every
// peer, with the trust roots.
func (m *Mesh) Trust() (*claim.Trust, error) {
	nodes := []claim.TrustedNode{{ID: m.Self.ID, Addr: m.Self.Addr, Key: claim.KeyOf(m.Self.SignKey)}}
	for _, p := range m.Peers {
		nodes = append(nodes, claim.TrustedNode{ID: p.ID, Addr: p.Addr, Key: p.SignKey})
	}
	return claim.NewTrust(nodes, m.TrustRoots)
}

// Policy returns the claim policy of the mesh.
func (m *Mesh) Policy() (*claim.Policy, error) {
	t, err := m.Trust()
	if err != nil {
		return nil, err
	}
	return &claim.Policy{Mesh: m.ID, Trust: t, Overlay: m.Overlay}, nil
}

// WGConfig returns the WireGuard configuration the mesh file declares:
// every peer with its address /128 and its allowed IPs, and no VIP. The VIP
// /128 is routed to its holder at run time (and by Render).
func (m *Mesh) WGConfig() wg.Config {
	c := wg.Config{PrivateKey: m.Self.WGKey, ListenPort: m.Self.ListenPort}
	for _, p := range m.Peers {
		c.Peers = append(c.Peers, wg.PeerConfig{
			PublicKey:           p.WGKey,
			Endpoint:            p.Endpoint,
			AllowedIPs:          append([]netip.Prefix{netip.PrefixFrom(p.Addr, 128)}, p.AllowedIPs...),
			PersistentKeepalive: p.Keepalive,
		})
	}
	return c.Normalize()
}

// Render writes the interface's wg-quick configuration: the node's address
// (the VIP is not an interface address here: the controller adds it with
// preferred_lft 0), and every peer, with vip/128 added to the allowed IPs of
// holder when holder is a peer. A holder that is this node, or the zero
// Addr, routes the VIP nowhere.
func (m *Mesh) Render(w io.Writer, vip, holder netip.Addr) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s: rendered by keel-vip from the mesh file %q; do not edit\n", m.Interface, m.ID)
	fmt.Fprintf(&b, "[Interface]\nPrivateKey = %s\nListenPort = %d\nAddress = %v\nMTU = %d\n",
		base64.StdEncoding.EncodeToString(m.Self.WGKey[:]), m.Self.ListenPort, netip.PrefixFrom(m.Self.Addr, 128), m.MTU)
	for _, p := range m.WGConfig().Peers {
		allowed := slices.Clone(p.AllowedIPs)
		if peer, ok := m.peerByWGKey(p.PublicKey); ok && vip.IsValid() && peer.Addr == holder {
			allowed = append(allowed, netip.PrefixFrom(vip, 128))
		}
		id, _ := m.peerByWGKey(p.PublicKey)
		fmt.Fprintf(&b, "\n[Peer]\n# %s\nPublicKey = %s\n", id.ID, base64.StdEncoding.EncodeToString(p.PublicKey[:]))
		if p.Endpoint.IsValid() {
			fmt.Fprintf(&b, "Endpoint = %v\n", p.Endpoint)
		}
		ss := make([]string, len(allowed))
		for i, a := range allowed {
			ss[i] = a.String()
		}
		fmt.Fprintf(&b, "AllowedIPs = %s\n", strings.Join(ss, ", "))
		if p.PersistentKeepalive > 0 {
			fmt.Fprintf(&b, "PersistentKeepalive = %d\n", int(p.PersistentKeepalive/time.Second))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (m *Mesh) peerByWGKey(k wg.Key) (Peer, bool) {
	for _, p := range m.Peers {
		if p.WGKey == k {
			return p, true
		}
	}
	return Peer{}, false
}

// Drift compares the live device's configuration with the mesh file and
// returns one line per difference (none: no drift). Every VIP /128 in vips
// is removed from the live allowed IPs first: the VIP moves between peers
// by design, so a move is never drift. Endpoints are not compared (they
// roam).
func (m *Mesh) Drift(live wg.Config, vips ...netip.Addr) []string {
	var out []string
	want := m.WGConfig()
	if live.PrivateKey != want.PrivateKey {
		out = append(out, "private key differs")
	}
	if live.ListenPort != want.ListenPort {
		out = append(out, fmt.Sprintf("listen port %d, want %d", live.ListenPort, want.ListenPort))
	}
	isVIP := func(p netip.Prefix) bool {
		return p.IsSingleIP() && slices.Contains(vips, p.Addr())
	}
	liveBy := map[wg.Key]wg.PeerConfig{}
	for _, p := range live.Peers {
		p.AllowedIPs = slices.DeleteFunc(slices.Clone(p.AllowedIPs), isVIP)
		liveBy[p.PublicKey] = p
	}
	for _, p := range want.Peers {
		id, _ := m.peerByWGKey(p.PublicKey)
		lp, ok := liveBy[p.PublicKey]
		if !ok {
			out = append(out, fmt.Sprintf("peer %s missing", id.ID))
			continue
		}
		delete(liveBy, p.PublicKey)
		if !slices.Equal(lp.AllowedIPs, p.AllowedIPs) {
			out = append(out, fmt.Sprintf("peer %s allowed ips %v, want %v", id.ID, lp.AllowedIPs, p.AllowedIPs))
		}
		if lp.PersistentKeepalive != p.PersistentKeepalive {
			out = append(out, fmt.Sprintf("peer %s keepalive %v, want %v", id.ID, lp.PersistentKeepalive, p.PersistentKeepalive))
		}
	}
	extra := make([]string, 0, len(liveBy))
	for k := range liveBy {
		extra = append(extra, "unknown peer "+base64.StdEncoding.EncodeToString(k[:]))
	}
	slices.Sort(extra)
	return append(out, extra...)
}

// CheckTimings checks the mesh file's timings (zero: claim's defaults)
// against claim's margin rules (claim.CheckTimings): the drop deadline
// holds at least claim.MinRenewalsPerDrop renewals, and the drop plus
// etcd's election timeout plus claim.TimingSlack fits in the lease TTL.
// `keel-vip check` fails on a violation; tend and the controller only
// warn, so that a mesh file that started a pair before still does.
func (m *Mesh) CheckTimings() error {
	return claim.CheckTimings(m.RenewInterval, m.LeaseTTL, m.DropAfter, m.ElectionTimeout)
}

// warnTimings logs, at warn, a violation of the timing margins
// (Mesh.CheckTimings); start goes on.
func warnTimings(log *slog.Logger, m *Mesh) {
	if err := m.CheckTimings(); err != nil {
		log.Warn("mesh file timings break the margin rule; keel-vip check refuses them, start goes on (see docs/defaults.md)", "err", err)
	}
}

// CheckSpawnUsers checks what spawn mode needs of the users: the
// controller and the listener run as two distinct, non-zero uids, so that
// neither can reach the other's sockets and files (the listener faces the
// network; the controller's state, pair copy and control socket are its
// own).
func (m *Mesh) CheckSpawnUsers() error {
	c, l := m.ControllerUID, m.ListenerUID
	switch {
	case c == 0 || l == 0:
		return fmt.Errorf("%w: users.controller_uid %d, users.listener_uid %d (0: unset or root)", ErrUsers, c, l)
	case c == l:
		return fmt.Errorf("%w: users.controller_uid and users.listener_uid are both %d", ErrUsers, c)
	}
	return nil
}
