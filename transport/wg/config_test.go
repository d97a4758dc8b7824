package wg

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

var (
	testPriv = mustHexKey(rfcAlicePriv)
	peerA    = GeneratePrivateKey().PublicKey()
	peerB    = GeneratePrivateKey().PublicKey()
)

func mustHexKey(s string) Key {
	k, err := parseHexKey(s)
	if err != nil {
		panic(err)
	}
	return k
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestConfigValidate(t *testing.T) {
	zero := Key{}
	psk := GeneratePresharedKey()
	ok := func() Config {
		return Config{PrivateKey: testPriv, ListenPort: 51820, Peers: []PeerConfig{
			{PublicKey: peerA, Endpoint: netip.MustParseAddrPort("127.0.0.1:1000"), AllowedIPs: []netip.Prefix{pfx("10.0.0.1/32"), pfx("10.1.0.0/16")}, PresharedKey: &psk},
			{PublicKey: peerB, AllowedIPs: []netip.Prefix{pfx("10.0.0.2/32"), pfx("10.1.2.3/32"), pfx("fd00::2/128")}, PersistentKeepalive: 25 * time.Second},
		}}
	}
	tests := []struct {
		name string
		mod  func(*Config)
		err  error
	}{
		{"ok", func(*Config) {}, nil},
		{"zero private key", func(c *Config) { c.PrivateKey = Key{} }, ErrZeroKey},
		{"zero peer key", func(c *Config) { c.Peers[0].PublicKey = Key{} }, ErrZeroKey},
		{"zero psk", func(c *Config) { c.Peers[0].PresharedKey = &zero }, ErrZeroKey},
		{"self peer", func(c *Config) { c.Peers[1].PublicKey = testPriv.PublicKey() }, ErrSelfPeer},
		{"duplicate peer", func(c *Config) { c.Peers[1].PublicKey = peerA }, ErrDuplicatePeer},
		{"same prefix two peers", func(c *Config) { c.Peers[1].AllowedIPs = append(c.Peers[1].AllowedIPs, pfx("10.0.0.1/32")) }, ErrDuplicateAllowedIP},
		{"same prefix twice", func(c *Config) { c.Peers[0].AllowedIPs = append(c.Peers[0].AllowedIPs, pfx("10.1.0.0/16")) }, ErrDuplicateAllowedIP},
		{"host bits set", func(c *Config) { c.Peers[0].AllowedIPs[1] = pfx("10.1.0.1/16") }, ErrBadPrefix},
		{"invalid prefix", func(c *Config) { c.Peers[0].AllowedIPs[1] = netip.Prefix{} }, ErrBadPrefix},
		{"endpoint port 0", func(c *Config) { c.Peers[0].Endpoint = netip.MustParseAddrPort("127.0.0.1:0") }, ErrBadEndpoint},
		{"endpoint unspecified", func(c *Config) { c.Peers[0].Endpoint = netip.MustParseAddrPort("0.0.0.0:51820") }, ErrBadEndpoint},
		{"endpoint multicast", func(c *Config) { c.Peers[0].Endpoint = netip.MustParseAddrPort("[ff02::1]:51820") }, ErrBadEndpoint},
		{"endpoint no address", func(c *Config) { c.Peers[0].Endpoint = netip.AddrPortFrom(netip.Addr{}, 5) }, ErrBadEndpoint},
		{"keepalive fraction", func(c *Config) { c.Peers[1].PersistentKeepalive = 1500 * time.Millisecond }, ErrBadKeepalive},
		{"keepalive negative", func(c *Config) { c.Peers[1].PersistentKeepalive = -time.Second }, ErrBadKeepalive},
		{"keepalive too long", func(c *Config) { c.Peers[1].PersistentKeepalive = MaxPersistentKeepalive + time.Second }, ErrBadKeepalive},
		{"nested prefixes ok", func(c *Config) { c.Peers[1].AllowedIPs = append(c.Peers[1].AllowedIPs, pfx("10.1.0.7/32")) }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.mod(&c)
			err := c.Validate()
			if !errors.Is(err, tc.err) {
				t.Fatalf("Validate() = %v, want %v", err, tc.err)
			}
		})
	}
	t.Run("too many peers", func(t *testing.T) {
		c := Config{PrivateKey: testPriv, Peers: make([]PeerConfig, MaxPeers+1)}
		if err := c.Validate(); !errors.Is(err, ErrTooManyPeers) {
			t.Fatalf("Validate() = %v", err)
		}
	})
}

func TestConfigNormalizeClone(t *testing.T) {
	psk := GeneratePresharedKey()
	c := Config{PrivateKey: testPriv, Peers: []PeerConfig{
		{PublicKey: peerB, AllowedIPs: []netip.Prefix{pfx("10.0.0.2/32"), pfx("10.0.0.0/24"), pfx("::/0")}},
		{PublicKey: peerA, PresharedKey: &psk},
	}}
	d := c.Clone()
	d.Normalize()
	if d.Peers[0].PublicKey.compare(d.Peers[1].PublicKey) > 0 {
		t.Fatal("peers not sorted")
	}
	if c.Peers[0].PublicKey != peerB {
		t.Fatal("Normalize of a clone changed the original")
	}
	for _, p := range d.Peers {
		if !slices.IsSortedFunc(p.AllowedIPs, comparePrefix) {
			t.Fatalf("allowed IPs not sorted: %v", p.AllowedIPs)
		}
		if p.PresharedKey != nil && p.PresharedKey == &psk {
			t.Fatal("Clone shares the preshared key")
		}
	}
}

// randomConfig draws a valid configuration from small pools of keys and
// prefixes, so that two draws share peers and prefixes.
func randomConfig(r *rand.Rand, keys []Key, prefixes []netip.Prefix) Config {
	c := Config{PrivateKey: testPriv}
	if r.IntN(4) == 0 {
		c.PrivateKey = keys[0] // a change of private key; keys[0] is never a peer
	}
	perm := r.Perm(len(keys) - 1)
	n := r.IntN(len(keys))
	for _, i := range perm[:n] {
		p := PeerConfig{PublicKey: pubOf(keys[i+1])}
		if r.IntN(2) == 0 {
			p.Endpoint = netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(1 + r.IntN(4))}), uint16(51820+r.IntN(3)))
		}
		if r.IntN(3) == 0 {
			k := keys[r.IntN(len(keys))]
			p.PresharedKey = &k
		}
		p.PersistentKeepalive = time.Duration(r.IntN(3)*25) * time.Second
		c.Peers = append(c.Peers, p)
	}
	if len(c.Peers) > 0 {
		for _, a := range prefixes {
			if r.IntN(3) > 0 {
				i := r.IntN(len(c.Peers))
				c.Peers[i].AllowedIPs = append(c.Peers[i].AllowedIPs, a)
			}
		}
	}
	return c
}

var testPrefixes = []netip.Prefix{
	pfx("10.0.0.1/32"), pfx("10.0.0.2/32"), pfx("10.0.0.3/32"), pfx("10.0.0.0/24"),
	pfx("10.9.0.0/16"), pfx("0.0.0.0/0"), pfx("fd00::1/128"), pfx("fd00::/64"), pfx("::ffff:10.0.0.9/128"),
}

var pubCache sync.Map // Key → Key

// pubOf is Key.PublicKey, memoized: the property tests draw thousands.
func pubOf(k Key) Key {
	if v, ok := pubCache.Load(k); ok {
		return v.(Key)
	}
	p := k.PublicKey()
	pubCache.Store(k, p)
	return p
}

func testKeys(n int) []Key {
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = GeneratePrivateKey()
	}
	return keys
}

// expectAfter is what the device should hold after Configure(want) from
// cur: want, except that a peer without an endpoint keeps the one it had,
// and ListenPort 0 keeps the port.
func expectAfter(cur, want Config) Config {
	exp := want.Clone()
	if exp.ListenPort == 0 {
		exp.ListenPort = cur.ListenPort
	}
	for i, p := range exp.Peers {
		if p.Endpoint.IsValid() {
			continue
		}
		for _, q := range cur.Peers {
			if q.PublicKey == p.PublicKey {
				exp.Peers[i].Endpoint = q.Endpoint
			}
		}
	}
	return exp.Normalize()
}

// TestDiffUAPIModel checks diffUAPI against the naive model: applying the
// diff from cur to want, with wireguard-go's semantics (applyUAPI), gives
// want, for random pairs of configurations.
func TestDiffUAPIModel(t *testing.T) {
	seed := testenv.Seed(t, 2)
	r := rand.New(rand.NewPCG(seed, seed))
	keys := testKeys(6)
	rounds := 400
	if testenv.Long() {
		rounds = 50000
	}
	for i := range rounds {
		cur := randomConfig(r, keys, testPrefixes)
		want := randomConfig(r, keys, testPrefixes)
		if err := cur.Validate(); err != nil {
			t.Fatalf("random config invalid: %v", err)
		}
		text := diffUAPI(cur, want)
		got, _, err := applyUAPI(text, cur)
		if err != nil {
			t.Fatalf("case %d: apply: %v\n%s", i, err, text)
		}
		got.ListenPort = want.ListenPort
		if exp := expectAfter(cur, want); !reflect.DeepEqual(got.Normalize(), exp) {
			t.Fatalf("case %d:\ncur  %+v\nwant %+v\ngot  %+v\ntext:\n%s", i, cur, exp, got, text)
		}
		// A second diff finds nothing left to do.
		if again := diffUAPI(got, want); again != "" && !onlyEndpointsDiffer(got, want) {
			t.Fatalf("case %d: second diff not empty:\n%s", i, again)
		}
	}
}

func onlyEndpointsDiffer(a, b Config) bool {
	a, b = a.Clone().Normalize(), b.Clone().Normalize()
	for i := range a.Peers {
		if i < len(b.Peers) && !b.Peers[i].Endpoint.IsValid() {
			a.Peers[i].Endpoint = netip.AddrPort{}
		}
	}
	return reflect.DeepEqual(a, b)
}
