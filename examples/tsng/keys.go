package tsng

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// Keys are a new node's keys, every one 32 bytes in standard base64 (the
// encoding keel-vip's files use too).
type Keys struct {
	WireGuardKey       wg.Key `json:"wireguard_key"`        // private; the node's config
	WireGuardPublicKey wg.Key `json:"wireguard_public_key"` // the peers' config
	IdentityKey        string `json:"identity_key"`         // Ed25519 seed, private; the node's config
	Identity           string `json:"identity"`             // Ed25519 public key; the peers' config
}

// GenerateKeys makes a new node's WireGuard key pair and Ed25519 identity.
func GenerateKeys() (Keys, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return Keys{}, err
	}
	wk := wg.GeneratePrivateKey()
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	return Keys{WireGuardKey: wk, WireGuardPublicKey: wk.PublicKey(),
		IdentityKey: base64.StdEncoding.EncodeToString(seed), Identity: base64.StdEncoding.EncodeToString(pub)}, nil
}

// parseIdentity reads a peer's Ed25519 public key: standard base64, the
// canonical form, or 64 hex digits, accepted with hex true.
func parseIdentity(s string) (id vip.NodeID, isHex bool, err error) {
	if len(s) == 2*len(id) {
		if _, err := hex.Decode(id[:], []byte(s)); err == nil {
			return id, true, nil
		}
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != len(id) {
		return vip.NodeID{}, false, fmt.Errorf("%q: want an Ed25519 public key of %d bytes in base64 (as `tsng keygen` prints it)", s, len(id))
	}
	copy(id[:], b)
	return id, false, nil
}

// Warnings lists what the config accepts but should say otherwise: peer
// identities in hex, with the canonical base64 form to write instead.
func (c *Config) Warnings() []string {
	var out []string
	for i, n := range c.Networks {
		for j, p := range n.Peers {
			if id, isHex, err := parseIdentity(p.Identity); err == nil && isHex {
				out = append(out, fmt.Sprintf("networks[%d].peers[%d].identity (%s) is hex; the canonical form is base64: %s",
					i, j, p.Name, base64.StdEncoding.EncodeToString(id[:])))
			}
		}
	}
	return out
}

// jsonError adds the line and column (1-based) of a JSON decoding error
// in b, when it has an offset.
func jsonError(b []byte, err error) error {
	var off int64
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	case errors.Is(err, io.ErrUnexpectedEOF):
		off = int64(len(b)) + 1
	default:
		return err
	}
	i := int(off) - 1
	if i < 0 {
		i = 0
	}
	if i > len(b) {
		i = len(b)
	}
	line := 1 + bytes.Count(b[:i], []byte{'\n'})
	col := i - bytes.LastIndexByte(b[:i], '\n')
	return fmt.Errorf("line %d, column %d: %w", line, col, err)
}

func runKeygen(_ context.Context, c *cliCtx, o *opts, _ []string) error {
	k, err := GenerateKeys()
	if err != nil {
		return err
	}
	if o.json {
		enc := json.NewEncoder(c.env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(k)
	}
	fmt.Fprintf(c.env.Stdout, "wireguard_key: %s\nwireguard_public_key: %s\nidentity_key: %s\nidentity: %s\n",
		k.WireGuardKey, k.WireGuardPublicKey, k.IdentityKey, k.Identity)
	return nil
}

// initOpts are the flags of `tsng init`.
type initOpts struct {
	network    string
	overlay    string
	address    string
	name       string
	dataDir    string
	socket     string
	mode       string
	endpoint   string
	entry      string
	httpProxy  string
	socks5     string
	listenPort uint
}

func initFlags(in *initOpts) func(fs *flag.FlagSet, o *opts) {
	return func(fs *flag.FlagSet, o *opts) {
		fs.StringVar(&in.network, "network", "", "the network's `name` (required)")
		fs.StringVar(&in.overlay, "overlay", "", "the network's agreed overlay range, an IPv4 `CIDR` such as 100.80.0.0/16 (required)")
		fs.StringVar(&in.address, "address", "", "this node's overlay `address` inside the range (default: one chosen to avoid every VIP reservation and node address the agent or the data directory knows)")
		fs.StringVar(&in.name, "name", "", "this node's `name` (default: the host name)")
		fs.StringVar(&in.dataDir, "data-dir", "/var/lib/tsng", "the agent's state `directory`")
		fs.StringVar(&in.socket, "socket", "", "the local API's socket `path` (default "+DefaultSocket+")")
		fs.StringVar(&in.mode, "mode", "netstack", "netstack (userspace, no root) or tun (a kernel TUN, CAP_NET_ADMIN)")
		fs.UintVar(&in.listenPort, "listen-port", 51820, "WireGuard's UDP `port` (0: any free port)")
		fs.StringVar(&o.config, "config", "", "the config `file` to write, never overwritten (default: the global --config, else "+DefaultConfig+")")
		fs.StringVar(&in.endpoint, "endpoint", "", "the `IP:PORT` other members reach this node's WireGuard at, for its peer entry")
		fs.StringVar(&in.entry, "entry", "", "also write this node's peer entry to `file` (public keys only; never overwritten), for `tsng peer add` on the others")
		fs.StringVar(&in.httpProxy, "http-proxy", "", "netstack mode: serve an HTTP proxy into the overlay on this loopback `IP:PORT`")
		fs.StringVar(&in.socks5, "socks5", "", "netstack mode: serve a SOCKS5 proxy into the overlay on this loopback `IP:PORT`")
	}
}

func runInit(in *initOpts) func(context.Context, *cliCtx, *opts, []string) error {
	return func(ctx context.Context, c *cliCtx, o *opts, _ []string) error {
		o.config = c.configFile(o)
		for _, r := range []struct{ flag, v string }{{"--network", in.network}, {"--overlay", in.overlay}} {
			if r.v == "" {
				return usageError{"init needs " + r.flag}
			}
		}
		if in.listenPort > 65535 {
			return usageError{fmt.Sprintf("--listen-port %d: want 0-65535", in.listenPort)}
		}
		if in.endpoint != "" {
			if _, err := netip.ParseAddrPort(in.endpoint); err != nil {
				return usageError{fmt.Sprintf("--endpoint %q: want IP:PORT", in.endpoint)}
			}
		}
		name := in.name
		if name == "" {
			h, err := os.Hostname()
			if err != nil || vip.ValidName(strings.ToLower(strings.Split(h, ".")[0])) != nil {
				return usageError{fmt.Sprintf("init: the host name %q is not a valid node name; give --name", h)}
			}
			name = strings.ToLower(strings.Split(h, ".")[0])
		}
		k, err := GenerateKeys()
		if err != nil {
			return err
		}
		chosen := ""
		if in.address == "" {
			if in.address, chosen, err = chooseAddress(ctx, c, in, k); err != nil {
				return err
			}
		}
		cfg := Config{DataDir: in.dataDir, Socket: in.socket, Networks: []NetworkConfig{{
			Name: in.network, Overlay: in.overlay, Mode: in.mode, Peers: []PeerConfig{}, HTTPProxy: in.httpProxy, SOCKS5: in.socks5,
			Node: NodeConfig{Name: name, Address: in.address, IdentityKey: k.IdentityKey, WireGuardKey: k.WireGuardKey, ListenPort: uint16(in.listenPort)},
		}}}
		if err := cfg.Validate(); err != nil {
			return err
		}
		b, err := json.MarshalIndent(cfg, "", "  ")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(o.config), 0o755); err != nil {
			return err
		}
		if in.entry != "" {
			if _, err := os.Lstat(in.entry); err == nil {
				return fmt.Errorf("%s exists; not overwriting it (remove it or give another --entry)", in.entry)
			}
		}
		if err := writeNewFile(o.config, append(b, '\n'), 0o600); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%s exists; not overwriting it (remove it or give another --config)", o.config)
			}
			return err
		}
		entry, _ := json.MarshalIndent(PeerConfig{Name: name, Address: in.address, Identity: k.Identity, WireGuardKey: k.WireGuardPublicKey, Endpoint: in.endpoint}, "", "  ")
		if chosen != "" {
			fmt.Fprintf(c.env.Stdout, "%s\n\n", chosen)
		}
		if in.entry != "" {
			if err := writeNewFile(in.entry, append(entry, '\n'), 0o644); err != nil {
				return fmt.Errorf("wrote %s, but not the entry: %w", o.config, err)
			}
			fmt.Fprintf(c.env.Stdout, "wrote %s (mode 0600)\nwrote %s: this node's peer entry; on every other member run `tsng peer add %s %s`\n", o.config, in.entry, in.network, in.entry)
			return nil
		}
		hint := `(add "endpoint", the IP:port they reach it at)`
		if in.endpoint != "" {
			hint = "(`--entry FILE` writes it to a file for `tsng peer add`)"
		}
		fmt.Fprintf(c.env.Stdout, "wrote %s (mode 0600)\n\nThis node's entry for the other members' \"peers\" lists %s:\n%s\n", o.config, hint, entry)
		return nil
	}
}

// writeNewFile creates path (never an existing file or a symlink's
// target) with mode perm and writes b to it; on a failure it removes what
// it created.
func writeNewFile(path string, b []byte, perm os.FileMode) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = fh.Write(b)
	if err == nil {
		err = fh.Sync()
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// chooseAddress picks `init`'s node address when --address is not given:
// one that avoids every VIP reservation (stored and effective) and node
// address that the agent on the socket knows for the network, or else that
// the data directory's stored state holds. It returns the address and a
// sentence saying what the choice could take into account.
func chooseAddress(ctx context.Context, c *cliCtx, in *initOpts, k Keys) (string, string, error) {
	prefix, err := netip.ParsePrefix(in.overlay)
	if err != nil || !prefix.Addr().Is4() {
		return "", "", usageError{fmt.Sprintf("--overlay %q: want an IPv4 CIDR such as 100.80.0.0/16", in.overlay)}
	}
	socket := in.socket
	if socket == "" {
		socket = c.client.Socket
	}
	known := learnReservations(ctx, socket, in.dataDir, NetworkConfig{Name: in.network, Overlay: in.overlay})
	avoid := map[netip.Addr]bool{}
	for _, r := range known.reservations {
		avoid[r.Reserved], avoid[r.Addr] = true, true
	}
	for _, n := range known.nodes {
		avoid[n.Addr] = true
	}
	seed, _ := base64.StdEncoding.DecodeString(k.Identity)
	a, err := vip.ChooseNodeAddr(prefix.Masked(), seed, func(a netip.Addr) bool { return avoid[a] })
	if err != nil {
		return "", "", fmt.Errorf("tsng: init: %w (known from %s); give --address", err, nonEmpty(known.source, "nothing"))
	}
	var why string
	switch {
	case known.source == "":
		why = fmt.Sprintf("address %v: chosen at random in %s; no VIP reservations were known (%s). Once this node has joined, `tsng config check` on the members' configs reports an address that collides with a VIP reservation.",
			a, prefix.Masked(), strings.Join(known.why, "; "))
	case len(known.nodes) > 0:
		why = fmt.Sprintf("address %v: chosen in %s avoiding the %d VIP reservations and %d node addresses known to %s.",
			a, prefix.Masked(), len(known.reservations), len(known.nodes), known.source)
	default:
		why = fmt.Sprintf("address %v: chosen in %s avoiding the %d VIP reservations in %s (%s); it names no node addresses, so compare with the other members' (`tsng config check` reports a collision).",
			a, prefix.Masked(), len(known.reservations), known.source, strings.Join(known.why, "; "))
	}
	return a.String(), why, nil
}

func runConfigCheck(ctx context.Context, c *cliCtx, _ *opts, a []string) error {
	cfg, err := LoadConfig(a[0])
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintln(c.env.Stderr, "tsng: warning:", w)
	}
	// Address collisions with the VIP reservations the agent (or, without
	// one, the stored state) knows.
	socket := nonEmpty(cfg.Socket, DefaultSocket)
	var problems, notes []string
	for i, n := range cfg.Networks {
		known := learnReservations(ctx, socket, cfg.DataDir, n)
		for _, w := range cfg.backendPortWarnings(i, known) {
			fmt.Fprintln(c.env.Stderr, "tsng: warning:", w)
		}
		if known.source == "" {
			notes = append(notes, fmt.Sprintf("%s: VIP reservations unknown, address collisions not checked (%s)", n.Name, strings.Join(known.why, "; ")))
			continue
		}
		p := checkCollisions(fmt.Sprintf("networks[%d]", i), n, known)
		problems = append(problems, p...)
		if len(p) == 0 {
			notes = append(notes, fmt.Sprintf("%s: no address collides with the %d VIP reservations known to %s", n.Name, len(known.reservations), known.source))
		}
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(c.env.Stderr, "tsng:", p)
		}
		return fmt.Errorf("%w: %s: %d node address(es) collide with VIP reservations", ErrConfig, a[0], len(problems))
	}
	var parts []string
	for _, n := range cfg.Networks {
		parts = append(parts, fmt.Sprintf("%s (%s, %s, %d peers)", n.Name, nonEmpty(n.Mode, "netstack"), n.Node.Address, len(n.Peers)))
	}
	fmt.Fprintf(c.env.Stdout, "%s: ok: %s\n", a[0], strings.Join(parts, "; "))
	for _, n := range notes {
		fmt.Fprintln(c.env.Stdout, "  "+n)
	}
	return nil
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// keysCommands are `tsng keygen`, `tsng init` and `tsng config check`.
func keysCommands() []*command {
	in := &initOpts{}
	return []*command{
		{name: "keygen", args: "[--json]", short: "Print a new node's keys: WireGuard private and public key, identity seed and public key (base64).", max: 0, flags: jsonFlag, run: runKeygen},
		{name: "init", args: "--network NAME --overlay CIDR [--address ADDR] [--name NODE] [--config FILE]", short: "Write a config file (mode 0600) with fresh keys for this node.", max: 0,
			long: "Prints this node's entry for the other members' peers lists. Without --address it chooses one that avoids every VIP reservation\n" +
				"and node address known to the agent (on --socket), or else to the data directory's stored state, and says what it knew.\n" +
				"See docs/tsng-config.md for every field.",
			flags: initFlags(in), run: runInit(in)},
		{name: "config", short: "Check config files.", sub: []*command{
			{name: "check", args: "FILE", short: "Check a config file, and its node addresses against known VIP reservations; print each problem, or ok.", min: 1, max: 1, run: runConfigCheck},
		}},
	}
}
