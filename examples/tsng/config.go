package tsng

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"reflect"
	"strings"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// Config is the agent's config file (JSON); docs/tsng-config.md describes
// every field and its default, and `tsng init` writes one.
//
//	{
//	  "data_dir": "/var/lib/tsng",
//	  "socket": "/run/tsng/tsng.sock",
//	  "metrics": "127.0.0.1:9469",
//	  "networks": [{
//	    "name": "home",
//	    "overlay": "100.80.0.0/16",
//	    "mode": "netstack",
//	    "node": {"name": "server1", "address": "100.80.0.1",
//	             "identity_key": "<base64 Ed25519 seed>", "wireguard_key": "<base64 private key>",
//	             "listen_port": 51820},
//	    "peers": [{"name": "server2", "address": "100.80.0.2", "identity": "<base64 Ed25519 public key>",
//	               "wireguard_key": "<base64 public key>", "endpoint": "192.0.2.2:51820"}]
//	  }]
//	}
type Config struct {
	DataDir string `json:"data_dir"`
	Socket  string `json:"socket,omitempty"`
	// Metrics is the Prometheus listen address, IP:port (or localhost:port);
	// empty: off. It must be a loopback address unless MetricsAnyAddress.
	Metrics           string `json:"metrics,omitempty"`
	MetricsAnyAddress bool   `json:"metrics_any_address,omitempty"`
	// UI is the editor's loopback address; empty means 127.0.0.1 on a free
	// port, "off" turns it off.
	UI       string          `json:"ui,omitempty"`
	LogLevel string          `json:"log_level,omitempty"`
	Networks []NetworkConfig `json:"networks"`
}

// NetworkConfig is one network the agent joins.
type NetworkConfig struct {
	Name string `json:"name"`
	// ID is the network's 16-byte id in hex; empty derives it from the name
	// and the overlay range, so every member computes the same id.
	ID      string `json:"id,omitempty"`
	Overlay string `json:"overlay"` // the agreed overlay range (IPv4)
	// Mode is "netstack" (userspace, no root; the default) or "tun" (a
	// kernel TUN, root).
	Mode    string `json:"mode,omitempty"`
	TUN     string `json:"tun,omitempty"` // kernel TUN name in tun mode
	Stopped bool   `json:"stopped,omitempty"`
	DNS     *bool  `json:"dns,omitempty"`      // answer DNS on the overlay address (default on)
	DNSPort uint16 `json:"dns_port,omitempty"` // default 53
	// DNSUpstreams are resolvers (IP or IP:port) for names outside the
	// network's domain; empty (the default) answers them REFUSED.
	DNSUpstreams []string     `json:"dns_upstreams,omitempty"`
	Control      uint16       `json:"control_port,omitempty"` // default 51830
	MaxFrame     int          `json:"max_frame,omitempty"`    // control frame limit; default crdt's
	Node         NodeConfig   `json:"node"`
	Peers        []PeerConfig `json:"peers"`
	Limits       vip.Limits   `json:"limits,omitzero"`
	ProbeFast    bool         `json:"probe_fast,omitempty"` // probes every 250 ms expiring after 750 ms
	// SOCKS5 and HTTPProxy are loopback IP:port listeners (netstack mode
	// only; empty: off) through which host applications reach the
	// network's VIPs and nodes by name.
	SOCKS5    string `json:"socks5,omitempty"`
	HTTPProxy string `json:"http_proxy,omitempty"`
	// BackendPorts are the host loopback ports ("tcp/8090", "udp/5353")
	// this node serves as VIP backends in netstack mode: a connection or
	// datagram arriving on the node's overlay address at a listed port is
	// relayed to 127.0.0.1 at that port. This node's config alone decides
	// it (any member may edit a VIP); the agent's own ports are refused.
	BackendPorts []string `json:"backend_ports,omitempty"`
	// UAPI serves the device read-only for `wg show` at
	// /var/run/wireguard/TUN.sock (tun mode only; default on when the
	// agent runs as root).
	UAPI *bool `json:"uapi,omitempty"`
	// ControlAuth is "preferred" (the default) or "required": whether the
	// control channel still carries frames without the key handshake to
	// and from members that have never authenticated by key (agents
	// before it), for rolling upgrades. See ControlAuth.
	ControlAuth string `json:"control_auth,omitempty"`
}

// NodeConfig is this node in a network.
type NodeConfig struct {
	Name         string `json:"name"`
	Address      string `json:"address"`
	IdentityKey  string `json:"identity_key" tsng:"secret"`  // base64 Ed25519 seed (32 bytes)
	WireGuardKey wg.Key `json:"wireguard_key" tsng:"secret"` // base64 Curve25519 private key
	ListenPort   uint16 `json:"listen_port,omitempty"`
}

// PeerConfig is another member of a network.
type PeerConfig struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	// Identity is the peer's Ed25519 public key in base64 (as `tsng keygen`
	// prints it); 64 hex digits are accepted with a warning.
	Identity     string `json:"identity"`
	WireGuardKey wg.Key `json:"wireguard_key"` // base64 Curve25519 public key
	Endpoint     string `json:"endpoint,omitempty"`
}

// ErrConfig means the config file is invalid; the message names the field.
var ErrConfig = errors.New("tsng: invalid config")

// LoadConfig reads and validates a config file. Every error but a read
// error wraps ErrConfig and names the field: its path from the top of the
// file, or the line and column of a JSON syntax error. No error quotes a
// private key.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Config
	if err := jsonx.Decode(b, &c); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfig, path, decodeError(b, err))
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, path, err)
	}
	return &c, nil
}

// Validate checks every field and reports the first bad one, named by its
// path (such as networks[0] (home).peers[1] (server3).endpoint).
func (c *Config) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

// validate is Validate without ErrConfig.
func (c *Config) validate() error {
	bad := fmt.Errorf
	if c.DataDir == "" {
		return bad("data_dir is required")
	}
	if len(c.Networks) == 0 {
		return bad("networks: none; want at least one network")
	}
	if c.Metrics != "" {
		ap, err := c.metricsAddr()
		if err != nil {
			return bad("metrics %q: want IP:port, such as 127.0.0.1:9469", c.Metrics)
		}
		if !ap.Addr().IsLoopback() && !c.MetricsAnyAddress {
			return bad("metrics %q is not a loopback address; set metrics_any_address to serve metrics there", c.Metrics)
		}
	}
	if c.UI != "" && c.UI != "off" {
		if ap, err := netip.ParseAddrPort(c.UI); err != nil || !ap.Addr().IsLoopback() {
			return bad("ui %q: want a loopback IP:port such as 127.0.0.1:8470, or \"off\"", c.UI)
		}
	}
	if c.LogLevel != "" {
		var level slog.Level
		if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
			return bad("log_level %q: want debug, info, warn or error", c.LogLevel)
		}
	}
	names := map[string]bool{}
	for i := range c.Networks {
		n := &c.Networks[i]
		where := fmt.Sprintf("networks[%d] (%s)", i, n.Name)
		if err := vip.ValidName(n.Name); err != nil {
			return bad("%s.name: %v", where, err)
		}
		if names[n.Name] {
			return bad("%s.name: network %q twice", where, n.Name)
		}
		names[n.Name] = true
		p, err := netip.ParsePrefix(n.Overlay)
		if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
			return bad("%s.overlay %q: want an IPv4 range such as 100.80.0.0/16", where, n.Overlay)
		}
		switch n.Mode {
		case "", "netstack", "tun":
		default:
			return bad("%s.mode %q: want netstack or tun", where, n.Mode)
		}
		if n.UAPI != nil && *n.UAPI && n.Mode != "tun" {
			return bad("%s.uapi: only in tun mode (wg show names the TUN interface)", where)
		}
		if _, err := ParseControlAuth(n.ControlAuth); err != nil {
			return bad("%s.control_auth: %v", where, err)
		}
		if _, err := parseUpstreams(n.DNSUpstreams, p); err != nil {
			return bad("%s.dns_upstreams: %v", where, err)
		}
		for _, px := range []struct{ field, v string }{{"socks5", n.SOCKS5}, {"http_proxy", n.HTTPProxy}} {
			if px.v == "" {
				continue
			}
			if n.Mode == "tun" {
				return bad("%s.%s: only in netstack mode (in tun mode host applications reach VIPs directly)", where, px.field)
			}
			if ap, err := netip.ParseAddrPort(px.v); err != nil || !ap.Addr().IsLoopback() {
				return bad("%s.%s %q: want a loopback IP:port such as 127.0.0.1:1080", where, px.field, px.v)
			}
		}
		if len(n.BackendPorts) > 0 {
			if n.Mode == "tun" {
				return bad("%s.backend_ports: only in netstack mode (in tun mode backend applications listen on the node's overlay address)", where)
			}
			if _, err := parseBackendPorts(n.BackendPorts); err != nil {
				return bad("%s.backend_ports%v", where, err)
			}
			agent := c.agentPorts()
			for j, e := range n.BackendPorts {
				k, _ := vip.ParsePortKey(e)
				if what, ok := agent[k]; ok {
					return bad("%s.backend_ports[%d] %q: a port of the agent itself (%s); a backend port must be an application's", where, j, e, what)
				}
			}
		}
		if n.ID != "" {
			if _, err := n.NetworkID(); err != nil {
				return bad("%s.id: %v", where, err)
			}
		}
		if err := vip.ValidName(n.Node.Name); err != nil {
			return bad("%s.node.name: %v", where, err)
		}
		if a, err := netip.ParseAddr(n.Node.Address); err != nil || !a.Is4() {
			return bad("%s.node.address %q: want an IPv4 address", where, n.Node.Address)
		}
		if _, err := n.identityKey(); err != nil {
			return bad("%s.node.identity_key: %v", where, err)
		}
		if n.Node.WireGuardKey.IsZero() {
			return bad("%s.node.wireguard_key is required", where)
		}
		seen := map[string]bool{n.Node.Name: true}
		addrs := map[netip.Addr]bool{}
		self, _ := n.Self()
		addrs[self.Addr] = true
		ids := map[vip.NodeID]bool{self.ID: true}
		wgKeys := map[wg.Key]bool{n.Node.WireGuardKey.PublicKey(): true}
		for j, pc := range n.Peers {
			pw := fmt.Sprintf("%s.peers[%d] (%s)", where, j, pc.Name)
			if err := vip.ValidName(pc.Name); err != nil {
				return bad("%s.name: %v", pw, err)
			}
			if seen[pc.Name] {
				return bad("%s.name: name %q twice", pw, pc.Name)
			}
			if a, err := netip.ParseAddr(pc.Address); err != nil || !a.Is4() {
				return bad("%s.address %q: want an IPv4 address", pw, pc.Address)
			}
			if _, _, err := parseIdentity(pc.Identity); err != nil {
				return bad("%s.identity: %v", pw, err)
			}
			info, err := pc.info()
			if err != nil {
				return bad("%s: %v", pw, err)
			}
			seen[pc.Name] = true
			if addrs[info.Addr] || !p.Contains(info.Addr) {
				return bad("%s.address %v: taken or outside %v", pw, info.Addr, p)
			}
			addrs[info.Addr] = true
			if ids[info.ID] {
				return bad("%s.identity: the identity of another member or of this node (each member has its own)", pw)
			}
			ids[info.ID] = true
			if pc.WireGuardKey.IsZero() {
				return bad("%s.wireguard_key is required", pw)
			}
			if wgKeys[pc.WireGuardKey] {
				return bad("%s.wireguard_key: the key of another member or this node's public key (each member has its own)", pw)
			}
			wgKeys[pc.WireGuardKey] = true
			if pc.Endpoint != "" {
				if _, err := netip.ParseAddrPort(pc.Endpoint); err != nil {
					return bad("%s.endpoint %q: want IP:port", pw, pc.Endpoint)
				}
			}
		}
		if !p.Contains(self.Addr) {
			return bad("%s.node.address %v is outside %v", where, self.Addr, p)
		}
	}
	return nil
}

// metricsAddr parses Metrics; localhost stands for 127.0.0.1.
func (c *Config) metricsAddr() (netip.AddrPort, error) {
	if rest, ok := strings.CutPrefix(c.Metrics, "localhost:"); ok {
		return netip.ParseAddrPort("127.0.0.1:" + rest)
	}
	return netip.ParseAddrPort(c.Metrics)
}

// NetworkID returns the network's crdt id.
func (n *NetworkConfig) NetworkID() (crdt.NetworkID, error) {
	var id crdt.NetworkID
	if n.ID == "" {
		h := sha256.Sum256([]byte("tsng-network/v1\x00" + n.Name + "\x00" + n.Overlay))
		copy(id[:], h[:])
		return id, nil
	}
	b, err := hex.DecodeString(n.ID)
	if err != nil || len(b) != len(id) {
		return id, fmt.Errorf("%q: want 32 hex digits", n.ID)
	}
	copy(id[:], b)
	return id, nil
}

func (n *NetworkConfig) identityKey() (ed25519.PrivateKey, error) {
	seed, err := base64.StdEncoding.DecodeString(n.Node.IdentityKey)
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("want a base64 Ed25519 seed of %d bytes", ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// Self returns this node as a member.
func (n *NetworkConfig) Self() (vip.NodeInfo, error) {
	if err := vip.ValidName(n.Node.Name); err != nil {
		return vip.NodeInfo{}, err
	}
	a, err := netip.ParseAddr(n.Node.Address)
	if err != nil || !a.Is4() {
		return vip.NodeInfo{}, fmt.Errorf("address %q: want an IPv4 address", n.Node.Address)
	}
	k, err := n.identityKey()
	if err != nil {
		return vip.NodeInfo{}, err
	}
	var id vip.NodeID
	copy(id[:], k.Public().(ed25519.PublicKey))
	return vip.NodeInfo{ID: id, Name: n.Node.Name, Addr: a}, nil
}

func (p *PeerConfig) info() (vip.NodeInfo, error) {
	if err := vip.ValidName(p.Name); err != nil {
		return vip.NodeInfo{}, err
	}
	a, err := netip.ParseAddr(p.Address)
	if err != nil || !a.Is4() {
		return vip.NodeInfo{}, fmt.Errorf("address %q: want an IPv4 address", p.Address)
	}
	id, _, err := parseIdentity(p.Identity)
	if err != nil {
		return vip.NodeInfo{}, fmt.Errorf("identity: %v", err)
	}
	return vip.NodeInfo{ID: id, Name: p.Name, Addr: a}, nil
}

// Members returns every member of the network, this node first.
func (n *NetworkConfig) Members() ([]vip.NodeInfo, error) {
	self, err := n.Self()
	if err != nil {
		return nil, err
	}
	out := []vip.NodeInfo{self}
	for i := range n.Peers {
		info, err := n.Peers[i].info()
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// decodeError is a config decoding error with its place: the line and
// column of a syntax error, else the path of the field it is in.
func decodeError(b []byte, err error) error {
	if _, ok := errors.AsType[*json.SyntaxError](err); ok || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, jsonx.ErrEmpty) || errors.Is(err, jsonx.ErrTrailingData) {
		return jsonError(b, err)
	}
	if ferr := locateDecodeError(b, reflect.TypeFor[Config]()); ferr != nil {
		return ferr
	}
	return jsonError(b, err)
}
