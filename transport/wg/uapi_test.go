package wg

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

// A "get" answer as wireguard-go writes it.
const sampleGet = `private_key=e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a
listen_port=12912
public_key=b85996fecc9c7f1fc6d2572a76eda11d59bcd20be8e543b15ce4bd85a8e75a33
preshared_key=188515093e952f5f22e865cef3012e72f8b5f0b598ac0309d5dacce3b70fcf52
protocol_version=1
endpoint=[abcd:23::33%2]:51820
last_handshake_time_sec=1700000000
last_handshake_time_nsec=5
tx_bytes=38333
rx_bytes=2224
persistent_keepalive_interval=0
allowed_ip=192.168.4.4/32
public_key=58402e695ba1772b1cc9309755f043251ea77fdcf10fbe63989ceb7e19321376
preshared_key=0000000000000000000000000000000000000000000000000000000000000000
protocol_version=1
endpoint=182.122.22.19:3233
last_handshake_time_sec=0
last_handshake_time_nsec=0
tx_bytes=0
rx_bytes=0
persistent_keepalive_interval=111
allowed_ip=192.168.4.6/32
allowed_ip=10.0.0.0/8
`

func TestApplyUAPIGet(t *testing.T) {
	c, st, err := applyUAPI(sampleGet, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c.ListenPort != 12912 || len(c.Peers) != 2 {
		t.Fatalf("%+v", c)
	}
	p0, p1 := c.Peers[0], c.Peers[1]
	if p0.PresharedKey == nil || p1.PresharedKey != nil {
		t.Fatal("preshared keys: zero must read as nil")
	}
	if p0.Endpoint.String() != "[abcd:23::33%2]:51820" || p1.PersistentKeepalive != 111*time.Second {
		t.Fatalf("peer attributes %+v %+v", p0, p1)
	}
	if !reflect.DeepEqual(p1.AllowedIPs, []netip.Prefix{pfx("192.168.4.6/32"), pfx("10.0.0.0/8")}) {
		t.Fatalf("allowed IPs %v", p1.AllowedIPs)
	}
	s0 := st[p0.PublicKey]
	if !s0.LastHandshake.Equal(time.Unix(1700000000, 5)) || s0.TxBytes != 38333 || s0.RxBytes != 2224 {
		t.Fatalf("stats %+v", s0)
	}
	if s1 := st[p1.PublicKey]; !s1.LastHandshake.IsZero() {
		t.Fatalf("never-handshaken peer has %v", s1.LastHandshake)
	}
}

var badUAPI = []string{
	"private_key=zz\n",
	"listen_port=70000\n",
	"no equals sign\n",
	"public_key=123\n",
	"public_key=" + strings.Repeat("ab", 32) + "\nallowed_ip=10.0.0.0/33\n",
	"public_key=" + strings.Repeat("ab", 32) + "\nendpoint=nowhere\n",
	"public_key=" + strings.Repeat("ab", 32) + "\npersistent_keepalive_interval=-1\n",
	"public_key=" + strings.Repeat("ab", 32) + "\nprotocol_version=2\n",
	"public_key=" + strings.Repeat("ab", 32) + "\nremove=yes\n",
	"public_key=" + strings.Repeat("ab", 32) + "\nlast_handshake_time_sec=-5\n",
	"public_key=" + strings.Repeat("ab", 32) + "\ntx_bytes=x\n",
	"replace_peers=false\n",
}

func TestApplyUAPIBad(t *testing.T) {
	for _, s := range badUAPI {
		if _, _, err := applyUAPI(s, Config{}); !errors.Is(err, ErrUAPI) {
			t.Errorf("applyUAPI(%q) = %v, want ErrUAPI", s, err)
		}
	}
	// Unknown keys are ignored; a blank line ends the operation.
	c, _, err := applyUAPI("fwmark=3\nfuture_key=1\nlisten_port=5\n\nlisten_port=6\n", Config{})
	if err != nil || c.ListenPort != 5 {
		t.Fatalf("%+v %v", c, err)
	}
}

func FuzzApplyUAPI(f *testing.F) {
	f.Add(sampleGet)
	for _, s := range badUAPI {
		f.Add(s)
	}
	keys := testKeys(3)
	f.Add(diffUAPI(Config{}, Config{PrivateKey: testPriv, Peers: []PeerConfig{{PublicKey: pubOf(keys[1]), AllowedIPs: testPrefixes[:3]}}}))
	f.Add("public_key=" + strings.Repeat("ab", 32) + "\nupdate_only=true\nallowed_ip=-10.0.0.1/32\nreplace_allowed_ips=true\n")
	f.Fuzz(func(t *testing.T, text string) {
		c, _, err := applyUAPI(text, Config{})
		if err != nil {
			if !errors.Is(err, ErrUAPI) && !errors.Is(err, ErrBadKey) {
				t.Fatalf("error %v is not ErrUAPI", err)
			}
			return
		}
		// What parsed is what a device would hold: writing it out again
		// and reading that back gives the same configuration.
		c = c.Normalize()
		again, _, err := applyUAPI(diffUAPI(Config{}, c), Config{})
		if err != nil {
			t.Fatalf("re-reading %+v: %v", c, err)
		}
		again.ListenPort = c.ListenPort
		if c.PrivateKey.IsZero() {
			again.PrivateKey = Key{}
		}
		if !reflect.DeepEqual(again.Normalize(), c) {
			t.Fatalf("round trip:\n%+v\n%+v", c, again)
		}
	})
}
