package claim

import (
	"crypto/ed25519"
	"encoding/binary"
	"math"
	"net/netip"
)

// Canonical encodings, version 1. Every integer is big-endian; every address
// is 16 bytes of IPv6 (IPv4 and IPv4-mapped addresses are refused); a mesh
// name is 1 to MaxMeshLen bytes of [a-z0-9.-]. Each encoding is exact: a
// decoder refuses trailing bytes, so one value has one encoding.
//
// Claim (kind 'C'):
//
//	 0      1 version = 1
//	 1      1 kind = 'C'
//	 2      1 mesh length m
//	 3      m mesh
//	 3+m   16 vip
//	19+m   16 holder's overlay address
//	35+m   32 holder's Ed25519 public key
//	67+m    8 epoch (≥ 1)
//	75+m    2 pair record length p
//	77+m    p pair record (its canonical encoding)
//	77+m+p 64 Ed25519 signature by the holder's key over
//	          ClaimLabel || bytes [0, 77+m+p)
//
// Pair record (kind 'P'):
//
//	 0      1 version = 1
//	 1      1 kind = 'P'
//	 2      1 mesh length m
//	 3      m mesh
//	 3+m   16 vip
//	19+m   16 member 0 address   (member 0's key sorts before member 1's)
//	35+m   32 member 0 key
//	67+m   16 member 1 address
//	83+m   32 member 1 key
//	115+m   1 signature count n (1..MaxPairSigs)
//	116+m  n × (32 signer key, 64 signature over PairLabel || bytes [0, 115+m)),
//	          sorted by signer key, no signer twice
//
// Release (kind 'R'), a request from one member that the other release the
// VIP for a next epoch:
//
//	 0      1 version = 1
//	 1      1 kind = 'R'
//	 2      1 mesh length m
//	 3      m mesh
//	 3+m   16 vip
//	19+m   16 requester's overlay address
//	35+m   32 requester's key
//	67+m    8 next epoch (≥ 1)
//	75+m   64 signature over ReleaseLabel || bytes [0, 75+m)
const (
	// Version is the version byte of every encoding this package writes.
	Version = 1
	// ClaimLabel prefixes the bytes a claim's signature covers.
	ClaimLabel = "keel vip 1\n"
	// PairLabel prefixes the bytes a pair record's signatures cover.
	PairLabel = "keel vip pair 1\n"
	// ReleaseLabel prefixes the bytes a release's signature covers.
	ReleaseLabel = "keel vip release 1\n"
	// MaxMeshLen is the longest mesh name, in bytes.
	MaxMeshLen = 64
	// MaxPairSigs is the most signatures a pair record carries.
	MaxPairSigs = 4
	// MaxEpochJump is how far ahead of the held claim a claim or release may
	// be, in epochs.
	MaxEpochJump = 64
	// MaxEpoch is the highest epoch a node takes: the last one whose
	// window (epoch + MaxEpochJump) does not overflow. Claims and releases
	// above it are refused with ErrEpochExhausted.
	MaxEpoch = math.MaxUint64 - MaxEpochJump
	// MaxMessageSize bounds any encoded claim, release or pair record.
	MaxMessageSize = 1024

	kindClaim   = 'C'
	kindPair    = 'P'
	kindRelease = 'R'
)

// PublicKey is an Ed25519 public key as a comparable array.
type PublicKey [ed25519.PublicKeySize]byte

// KeyOf returns the PublicKey of an Ed25519 private key.
func KeyOf(k ed25519.PrivateKey) PublicKey {
	var p PublicKey
	copy(p[:], k.Public().(ed25519.PublicKey))
	return p
}

func (k PublicKey) verify(label string, msg, sig []byte) bool {
	buf := make([]byte, 0, len(label)+len(msg))
	buf = append(append(buf, label...), msg...)
	return ed25519.Verify(ed25519.PublicKey(k[:]), buf, sig)
}

func sign(k ed25519.PrivateKey, label string, msg []byte) []byte {
	buf := make([]byte, 0, len(label)+len(msg))
	buf = append(append(buf, label...), msg...)
	return ed25519.Sign(k, buf)
}

func validMesh(m string) bool {
	if len(m) == 0 || len(m) > MaxMeshLen {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func validAddr(a netip.Addr) bool { return a.Is6() && !a.Is4In6() && a.Zone() == "" }

func appendHeader(b []byte, kind byte, mesh string, vip netip.Addr) []byte {
	b = append(b, Version, kind, byte(len(mesh)))
	b = append(b, mesh...)
	a := vip.As16()
	return append(b, a[:]...)
}

func appendAddr(b []byte, a netip.Addr) []byte {
	x := a.As16()
	return append(b, x[:]...)
}

// reader is a bounds-checked cursor over an encoding.
type reader struct {
	b   []byte
	off int
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n < 0 || len(r.b)-r.off < n {
		r.bad = true
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) u8() byte {
	s := r.take(1)
	if s == nil {
		return 0
	}
	return s[0]
}

func (r *reader) u16() int {
	s := r.take(2)
	if s == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(s))
}

func (r *reader) u64() uint64 {
	s := r.take(8)
	if s == nil {
		return 0
	}
	return binary.BigEndian.Uint64(s)
}

func (r *reader) addr() netip.Addr {
	s := r.take(16)
	if s == nil {
		return netip.Addr{}
	}
	a := netip.AddrFrom16([16]byte(s))
	if a.Is4In6() {
		r.bad = true
	}
	return a
}

func (r *reader) key() PublicKey {
	s := r.take(32)
	if s == nil {
		return PublicKey{}
	}
	return PublicKey(s)
}

// header reads version, kind, mesh and vip. It returns ErrVersion for an
// unknown version and ErrMalformed for anything else wrong.
func (r *reader) header(kind byte) (mesh string, vip netip.Addr, err error) {
	if len(r.b) > MaxMessageSize {
		return "", netip.Addr{}, ErrTooLarge
	}
	v := r.u8()
	if r.bad {
		return "", netip.Addr{}, ErrMalformed
	}
	if v != Version {
		return "", netip.Addr{}, ErrVersion
	}
	if r.u8() != kind {
		return "", netip.Addr{}, ErrMalformed
	}
	m := string(r.take(int(r.u8())))
	vip = r.addr()
	if r.bad || !validMesh(m) {
		return "", netip.Addr{}, ErrMalformed
	}
	return m, vip, nil
}
