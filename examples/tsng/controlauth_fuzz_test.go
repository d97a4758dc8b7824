package tsng

import (
	"bytes"
	"crypto/ed25519"
	"net"
	"testing"
	"time"
)

// fuzzConn is a net.Conn that reads from a fixed input and counts what it
// hands out; writes go nowhere.
type fuzzConn struct {
	r    *bytes.Reader
	read int
}

func (f *fuzzConn) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	f.read += n
	return n, err
}
func (f *fuzzConn) Write(b []byte) (int, error) { return len(b), nil }
func (f *fuzzConn) Close() error                { return nil }
func (f *fuzzConn) LocalAddr() net.Addr         { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3), Port: 51830} }
func (f *fuzzConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 40000}
}
func (f *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (f *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (f *fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzControlAuth feeds arbitrary bytes to the handshake's parsers and to
// both sides of the handshake. Nothing panics, each parser accepts only
// its exact length and magic, neither side authenticates (a signature
// must cover a fresh nonce the input cannot know), and neither side reads
// more than its messages' fixed sizes, so no input makes it buffer more.
func FuzzControlAuth(f *testing.F) {
	k, self := testKey("B")
	_, peer := testKey("A")
	var nonce [authNonce]byte
	hello := appendHello(nil, &nonce)
	reply := appendReply(nil, authVersion, &nonce, make([]byte, ed25519.SignatureSize))
	f.Add([]byte{})
	f.Add([]byte(authMagic))
	f.Add(hello)
	f.Add(append(hello, make([]byte, finishLen)...))
	f.Add(reply)
	f.Add(append(reply, legacyFrame("frame")...))
	f.Add(legacyFrame("frame"))
	f.Add(append([]byte(authMagic), 0))
	f.Add(append([]byte(authMagic), 2))
	c := &Control{o: ControlOptions{Key: k, HandshakeTimeout: time.Second}, self: self}
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, _, err := parseHello(b); err == nil && (len(b) != helloLen || string(b[:4]) != authMagic || v == 0) {
			t.Fatalf("parseHello took %x", b)
		}
		if v, _, _, err := parseReply(b); err == nil && (len(b) != replyLen || string(b[:4]) != authMagic || v != authVersion) {
			t.Fatalf("parseReply took %x", b)
		}
		if _, err := parseFinish(b); err == nil && len(b) != finishLen {
			t.Fatalf("parseFinish took %x", b)
		}
		// The listener's side, after the first 4 bytes.
		if len(b) >= 4 {
			var first [4]byte
			copy(first[:], b)
			conn := &fuzzConn{r: bytes.NewReader(b[4:])}
			if err := c.authAccept(conn, first, peer); err == nil {
				t.Fatalf("the listener authenticated %x", b)
			}
			if conn.read > helloLen-4+finishLen {
				t.Fatalf("the listener read %d bytes", conn.read)
			}
		}
		// The dialer's side.
		conn := &fuzzConn{r: bytes.NewReader(b)}
		if err := c.authDial(conn, peer); err == nil {
			t.Fatalf("the dialer authenticated %x", b)
		}
		if conn.read > replyLen {
			t.Fatalf("the dialer read %d bytes", conn.read)
		}
	})
}
