package tsng

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/vipkit/vipkit/vip"
)

// ControlAuth says what the control channel requires of a connection: the
// key handshake, in which both ends prove their member identity key, or
// frames without it, as agents before the handshake send them (legacy).
// docs/wire.md describes the handshake (beyond the spec).
type ControlAuth uint8

const (
	// ControlAuthPreferred authenticates every connection the peer can
	// authenticate, and carries legacy frames to and from a member until
	// that member has authenticated by key once: from then on (until this
	// agent restarts) the member is pinned, its unauthenticated connections
	// are refused, and it is never sent legacy frames. The default, for
	// rolling upgrades.
	ControlAuthPreferred ControlAuth = iota
	// ControlAuthRequired accepts and sends nothing unauthenticated.
	ControlAuthRequired
	// controlAuthOff is the channel of agents before the handshake: legacy
	// frames only, byte for byte. Tests play old agents with it.
	controlAuthOff
)

// ParseControlAuth parses the control_auth setting: "preferred" (or
// empty) or "required".
func ParseControlAuth(s string) (ControlAuth, error) {
	switch s {
	case "", "preferred":
		return ControlAuthPreferred, nil
	case "required":
		return ControlAuthRequired, nil
	}
	return 0, fmt.Errorf("%q: want preferred or required", s)
}

// String returns the setting's name.
func (a ControlAuth) String() string {
	switch a {
	case ControlAuthPreferred:
		return "preferred"
	case ControlAuthRequired:
		return "required"
	case controlAuthOff:
		return "off"
	}
	return fmt.Sprintf("ControlAuth(%d)", uint8(a))
}

// The handshake's wire constants (docs/wire.md).
const (
	// controlAuthLabel starts every handshake signature. It differs from
	// crdt.Domain ("tsunagi-vip-field/v1\x00") within the first bytes of
	// both, so no handshake signature is a field signature, nor the reverse.
	controlAuthLabel = "tsunagi-vip-control-auth/v1\x00"
	// authMagic starts the dialer's hello. A legacy frame starts with its
	// 4-byte big-endian length, below the frame limit (at most
	// maxControlFrame, so its first byte is 0); the magic's first byte is
	// not 0, and an agent without the handshake reads it as a length over
	// its limit and closes the connection.
	authMagic   = "\xfavca"
	authVersion = 1
	authNonce   = 32
	// helloLen is magic, version (the highest the dialer speaks), nonce.
	helloLen = 4 + 1 + authNonce
	// replyLen is magic, version (the one both speak), nonce, signature.
	replyLen = 4 + 1 + authNonce + ed25519.SignatureSize
	// finishLen is the dialer's signature.
	finishLen = ed25519.SignatureSize
	// The role byte of each signature.
	roleDialer   = 'D'
	roleListener = 'L'
	// maxControlFrame bounds ControlOptions.MaxFrame, so that no legacy
	// length can be the magic and an old agent refuses the hello.
	maxControlFrame = 1<<24 - 1
)

// The handshake's failures; each is counted in ControlStats.AuthRefused
// and logged with the peer.
var (
	// errAuthNoReply: the listener closed the connection on the hello
	// without a byte, as an agent without the handshake does.
	errAuthNoReply = errors.New("the peer closed the connection on the hello (an agent without key authentication?)")
	errAuthFormat  = errors.New("malformed handshake message")
	errAuthVersion = errors.New("handshake version not spoken here")
	errAuthSig     = errors.New("handshake signature does not verify under the member's key")
	errAuthTimeout = errors.New("handshake not complete within the handshake timeout")
	errAuthAddr    = errors.New("connection endpoints unknown")
)

// appendHello appends the dialer's hello.
func appendHello(b []byte, nonce *[authNonce]byte) []byte {
	b = append(b, authMagic...)
	b = append(b, authVersion)
	return append(b, nonce[:]...)
}

// parseHello parses a hello of exactly helloLen bytes. It allocates
// nothing.
func parseHello(b []byte) (version byte, nonce [authNonce]byte, err error) {
	if len(b) != helloLen || string(b[:4]) != authMagic {
		return 0, nonce, errAuthFormat
	}
	if b[4] == 0 {
		return 0, nonce, errAuthVersion
	}
	copy(nonce[:], b[5:])
	return b[4], nonce, nil
}

// appendReply appends the listener's answer.
func appendReply(b []byte, version byte, nonce *[authNonce]byte, sig []byte) []byte {
	b = append(b, authMagic...)
	b = append(b, version)
	b = append(b, nonce[:]...)
	return append(b, sig...)
}

// parseReply parses a reply of exactly replyLen bytes. It allocates
// nothing.
func parseReply(b []byte) (version byte, nonce [authNonce]byte, sig [ed25519.SignatureSize]byte, err error) {
	if len(b) != replyLen || string(b[:4]) != authMagic {
		return 0, nonce, sig, errAuthFormat
	}
	if b[4] != authVersion {
		return 0, nonce, sig, errAuthVersion
	}
	copy(nonce[:], b[5:5+authNonce])
	copy(sig[:], b[5+authNonce:])
	return b[4], nonce, sig, nil
}

// parseFinish parses the dialer's last message, exactly finishLen bytes.
func parseFinish(b []byte) (sig [ed25519.SignatureSize]byte, err error) {
	if len(b) != finishLen {
		return sig, errAuthFormat
	}
	copy(sig[:], b)
	return sig, nil
}

// authTranscript is what each side signs: the label, the signer's role,
// the version, both nonces, both keys and both TCP endpoints, dialer's
// first each time, as the dialer sees them (the listener sees the same
// two, swapped into local and remote).
type authTranscript struct {
	version        byte
	nonceD, nonceL [authNonce]byte
	keyD, keyL     vip.NodeID
	epD, epL       netip.AddrPort
}

const transcriptLen = len(controlAuthLabel) + 2 + 2*authNonce + 2*len(vip.NodeID{}) + 2*18

func (t *authTranscript) message(role byte) []byte {
	b := make([]byte, 0, transcriptLen)
	b = append(b, controlAuthLabel...)
	b = append(b, role, t.version)
	b = append(b, t.nonceD[:]...)
	b = append(b, t.nonceL[:]...)
	b = append(b, t.keyD[:]...)
	b = append(b, t.keyL[:]...)
	b = appendEndpoint(b, t.epD)
	return appendEndpoint(b, t.epL)
}

// appendEndpoint appends ep as 16 address bytes (IPv4 mapped) and a
// big-endian port.
func appendEndpoint(b []byte, ep netip.AddrPort) []byte {
	a := ep.Addr().Unmap().WithZone("").As16()
	b = append(b, a[:]...)
	return binary.BigEndian.AppendUint16(b, ep.Port())
}

func (t *authTranscript) sign(key ed25519.PrivateKey, role byte) []byte {
	return ed25519.Sign(key, t.message(role))
}

func (t *authTranscript) verify(key vip.NodeID, role byte, sig []byte) bool {
	return ed25519.Verify(key[:], t.message(role), sig)
}

// tcpAddrPort returns a connection endpoint's address and port. A nil
// address (gVisor's gonet reports one once the endpoint has closed) is
// an error.
func tcpAddrPort(a net.Addr) (netip.AddrPort, error) {
	if a == nil {
		return netip.AddrPort{}, errAuthAddr
	}
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort(), nil
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return ap, fmt.Errorf("%w: %v", errAuthAddr, err)
	}
	return ap, nil
}

// endpoints returns conn's local and remote TCP endpoints.
func endpoints(conn net.Conn) (local, remote netip.AddrPort, err error) {
	if local, err = tcpAddrPort(conn.LocalAddr()); err != nil {
		return
	}
	remote, err = tcpAddrPort(conn.RemoteAddr())
	return
}

// readAuth reads exactly len(b) bytes of the handshake; the connection's
// deadline bounds the wait.
func readAuth(r io.Reader, b []byte) error {
	n, err := io.ReadFull(r, b)
	if err == nil {
		return nil
	}
	return authReadErr(n, len(b), err)
}

// authReadErr names the failure of a handshake read that got n of want
// bytes.
func authReadErr(n, want int, err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return errAuthTimeout
	}
	return fmt.Errorf("%w: %d of %d bytes: %v", errAuthFormat, n, want, err)
}

// authDial runs the dialer's side of the handshake on a new connection to
// member to, within the handshake timeout: hello, the listener's signed
// reply, the dialer's signature. It returns errAuthNoReply when the peer
// closed the connection without answering.
func (c *Control) authDial(conn net.Conn, to vip.NodeID) error {
	var t authTranscript
	var err error
	if t.epD, t.epL, err = endpoints(conn); err != nil {
		return err
	}
	t.keyD, t.keyL = c.self, to
	rand.Read(t.nonceD[:])
	_ = conn.SetDeadline(time.Now().Add(c.o.HandshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	if _, err := conn.Write(appendHello(make([]byte, 0, helloLen), &t.nonceD)); err != nil {
		return fmt.Errorf("%w: %v", errAuthNoReply, err)
	}
	var buf [replyLen]byte
	n, err := io.ReadFull(conn, buf[:])
	if n == 0 && err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return errAuthTimeout
		}
		return errAuthNoReply
	}
	if err != nil {
		return authReadErr(n, len(buf), err)
	}
	var sigL [ed25519.SignatureSize]byte
	if t.version, t.nonceL, sigL, err = parseReply(buf[:]); err != nil {
		return err
	}
	if !t.verify(t.keyL, roleListener, sigL[:]) {
		return errAuthSig
	}
	if _, err := conn.Write(t.sign(c.o.Key, roleDialer)); err != nil {
		return fmt.Errorf("%w: writing the signature: %v", errAuthFormat, err)
	}
	return nil
}

// authAccept runs the listener's side of the handshake with member from,
// whose hello starts with first (the magic); the connection's deadline is
// already set.
func (c *Control) authAccept(conn net.Conn, first [4]byte, from vip.NodeID) error {
	var t authTranscript
	var err error
	if t.epL, t.epD, err = endpoints(conn); err != nil {
		return err
	}
	t.keyD, t.keyL = from, c.self
	var hello [helloLen]byte
	copy(hello[:], first[:])
	if err := readAuth(conn, hello[4:]); err != nil {
		return err
	}
	v, nonceD, err := parseHello(hello[:])
	if err != nil {
		return err
	}
	t.version, t.nonceD = min(v, authVersion), nonceD
	rand.Read(t.nonceL[:])
	reply := appendReply(make([]byte, 0, replyLen), t.version, &t.nonceL, t.sign(c.o.Key, roleListener))
	if _, err := conn.Write(reply); err != nil {
		return fmt.Errorf("%w: writing the reply: %v", errAuthFormat, err)
	}
	var fin [finishLen]byte
	if err := readAuth(conn, fin[:]); err != nil {
		return err
	}
	sigD, err := parseFinish(fin[:])
	if err != nil {
		return err
	}
	if !t.verify(t.keyD, roleDialer, sigD[:]) {
		return errAuthSig
	}
	return nil
}
