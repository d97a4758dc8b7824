package wg

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// uapiDevice starts a device with one peer on real loopback UDP.
func uapiDevice(t *testing.T) (*Device, Key, Key) {
	t.Helper()
	priv, peerPriv := GeneratePrivateKey(), GeneratePrivateKey()
	io, _ := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	cfg := Config{PrivateKey: priv, ListenPort: 0, Peers: []PeerConfig{{
		PublicKey: peerPriv.PublicKey(), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("100.80.0.2/32")},
		Endpoint: netip.MustParseAddrPort("127.0.0.1:51999"),
	}}}
	d, err := NewDevice(io, cfg, Options{Bind: NewUDPBind(UDPBindOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, priv, peerPriv.PublicKey()
}

// TestUAPIWgShow: Debian's wg show and wg showconf read the device
// through its socket in /var/run/wireguard; wg set is refused and
// changes nothing.
func TestUAPIWgShow(t *testing.T) {
	testenv.NeedRoot(t)
	wgBin := testenv.NeedBinary(t, "wg")
	d, priv, peer := uapiDevice(t)
	name := fmt.Sprintf("vkt%d", os.Getpid()%1000000)
	s, err := d.ServeUAPI(name, UAPIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var st unix.Stat_t
	if err := unix.Stat(s.Path(), &st); err != nil || st.Mode&0o777 != 0o600 || st.Uid != 0 {
		t.Fatalf("socket %s: mode %o uid %d %v", s.Path(), st.Mode&0o777, st.Uid, err)
	}
	if s.Path() != filepath.Join(UAPIDir, name+".sock") {
		t.Fatalf("socket at %s", s.Path())
	}
	out, err := exec.Command(wgBin, "show", name).CombinedOutput()
	if err != nil {
		t.Fatalf("wg show: %v\n%s", err, out)
	}
	for _, want := range []string{"interface: " + name, "public key: " + priv.PublicKey().String(), "private key: (hidden)", "peer: " + peer.String(), "endpoint: 127.0.0.1:51999", "allowed ips: 100.80.0.2/32"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("wg show: no %q in\n%s", want, out)
		}
	}
	out, err = exec.Command(wgBin, "showconf", name).CombinedOutput()
	if err != nil {
		t.Fatalf("wg showconf: %v\n%s", err, out)
	}
	for _, want := range []string{"[Interface]", "PrivateKey = " + priv.String(), "[Peer]", "PublicKey = " + peer.String(), "AllowedIPs = 100.80.0.2/32", "Endpoint = 127.0.0.1:51999"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("wg showconf: no %q in\n%s", want, out)
		}
	}
	// wg set is refused, and the device keeps its configuration.
	out, err = exec.Command(wgBin, "set", name, "peer", peer.String(), "remove").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Operation not permitted") {
		t.Fatalf("wg set: %v %q, want Operation not permitted", err, out)
	}
	if c, err := d.Config(); err != nil || len(c.Peers) != 1 {
		t.Fatalf("after wg set: %+v %v", c, err)
	}
	// Close removes the socket.
	s.Close()
	if _, err := os.Lstat(s.Path()); err == nil {
		t.Fatal("the socket outlived Close")
	}
}

// TestUAPIDirChecks: a directory others may write to is refused, a live
// socket of the same name is not taken over, and a stale one is.
func TestUAPIDirChecks(t *testing.T) {
	testenv.NeedRoot(t)
	d, _, _ := uapiDevice(t)
	open := t.TempDir()
	os.Chmod(open, 0o777)
	if _, err := d.ServeUAPI("x", UAPIOptions{Dir: open}); err == nil || !strings.Contains(err.Error(), "not root's alone") {
		t.Fatalf("world-writable dir: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "wireguard")
	s, err := d.ServeUAPI("x", UAPIOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("created dir: %v %v", fi.Mode(), err)
	}
	if _, err := d.ServeUAPI("x", UAPIOptions{Dir: dir}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second server on a live socket: %v", err)
	}
	s.Close()
	// A stale socket (its listener gone without unlinking) is replaced.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "x.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	s, err = d.ServeUAPI("x", UAPIOptions{Dir: dir})
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	s.Close()
	if _, err := d.ServeUAPI("a/b", UAPIOptions{Dir: dir}); err == nil {
		t.Fatal("a name with a slash was accepted")
	}
}

// uapiGet asks the socket at path for the device's state and returns
// the reply's errno line.
func uapiGet(t *testing.T, path string) string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("get=1\n\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading %s: %v", path, err)
		}
		if strings.HasPrefix(line, "errno=") {
			return strings.TrimSpace(line)
		}
	}
}

// TestUAPINameInUse: two devices cannot serve one name (two agents in
// different network namespaces share /var/run/wireguard). The second
// start fails with ErrUAPIInUse and the first socket keeps answering;
// even with the first's socket file gone (an administrator's rm, or a
// racing start that judged it stale) the name stays taken while the
// first server runs.
func TestUAPINameInUse(t *testing.T) {
	testenv.NeedRoot(t)
	d1, _, _ := uapiDevice(t)
	d2, _, _ := uapiDevice(t)
	dir := filepath.Join(t.TempDir(), "wireguard")
	s1, err := d1.ServeUAPI("tsng-home", UAPIOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	_, err = d2.ServeUAPI("tsng-home", UAPIOptions{Dir: dir})
	if !errors.Is(err, ErrUAPIInUse) || !strings.Contains(err.Error(), s1.Path()) {
		t.Fatalf("second server: %v, want ErrUAPIInUse naming %s", err, s1.Path())
	}
	if got := uapiGet(t, s1.Path()); got != "errno=0" {
		t.Fatalf("first server after the refused second: %q", got)
	}
	if err := os.Remove(s1.Path()); err != nil {
		t.Fatal(err)
	}
	if s2, err := d2.ServeUAPI("tsng-home", UAPIOptions{Dir: dir}); !errors.Is(err, ErrUAPIInUse) {
		if s2 != nil {
			s2.Close()
		}
		t.Fatalf("second server after the first's socket file went: %v, want ErrUAPIInUse", err)
	}
	// Once the first closes, the name is free again.
	s1.Close()
	s2, err := d2.ServeUAPI("tsng-home", UAPIOptions{Dir: dir})
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	defer s2.Close()
	if got := uapiGet(t, s2.Path()); got != "errno=0" {
		t.Fatalf("second server: %q", got)
	}
	// Closing the first again takes nothing from the second.
	s1.Close()
	if _, err := d1.ServeUAPI("tsng-home", UAPIOptions{Dir: dir}); !errors.Is(err, ErrUAPIInUse) {
		t.Fatalf("a third server while the second runs: %v, want ErrUAPIInUse", err)
	}
	// Close leaves nothing in the directory.
	s2.Close()
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("after Close the directory holds %v (%v)", ents, err)
	}
}
