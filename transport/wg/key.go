package wg

import (
	"crypto/ecdh"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
)

// KeyLen is the length in bytes of a WireGuard key.
const KeyLen = 32

// Key is a Curve25519 key as WireGuard uses it: a private key, a public key
// or a preshared key. The zero Key means "no key" and is refused wherever a
// key is required. Its text form (String, MarshalText) is standard base64,
// the form wg(8) and configuration files use.
type Key [KeyLen]byte

// GeneratePrivateKey returns a new random private key, clamped as RFC 7748
// describes (the same form `wg genkey` prints). It reads crypto/rand, which
// does not fail on supported platforms.
func GeneratePrivateKey() Key {
	var k Key
	_, _ = rand.Read(k[:])
	k.clamp()
	return k
}

// GeneratePresharedKey returns a new random preshared key (`wg genpsk`).
func GeneratePresharedKey() Key {
	var k Key
	_, _ = rand.Read(k[:])
	return k
}

// clamped returns k clamped, as wireguard-go stores a private key; the zero
// key stays zero ("no key").
func (k Key) clamped() Key {
	if !k.IsZero() {
		k.clamp()
	}
	return k
}

func (k *Key) clamp() {
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
}

// ParseKey parses a key in standard base64 (44 characters). It fails with an
// error matching ErrBadKey.
func ParseKey(s string) (Key, error) {
	var k Key
	if len(s) != base64.StdEncoding.EncodedLen(KeyLen) {
		return Key{}, fmt.Errorf("%w: base64 key has %d characters, want %d", ErrBadKey, len(s), base64.StdEncoding.EncodedLen(KeyLen))
	}
	// 44 characters can hold 33 bytes (no padding): decode into room for
	// that, then insist on exactly 32.
	var buf [KeyLen + 1]byte
	n, err := base64.StdEncoding.Decode(buf[:], []byte(s))
	if err != nil || n != KeyLen {
		return Key{}, fmt.Errorf("%w: %q is not base64 of 32 bytes", ErrBadKey, s)
	}
	copy(k[:], buf[:KeyLen])
	return k, nil
}

// parseHexKey parses the lower-case hex form the UAPI uses.
func parseHexKey(s string) (Key, error) {
	var k Key
	if len(s) != 2*KeyLen {
		return Key{}, fmt.Errorf("%w: hex key has %d characters, want %d", ErrBadKey, len(s), 2*KeyLen)
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return Key{}, fmt.Errorf("%w: %v", ErrBadKey, err)
	}
	return k, nil
}

// PublicKey returns the public key of the private key k (`wg pubkey`). The
// private key is clamped first, as WireGuard does.
func (k Key) PublicKey() Key {
	c := k
	c.clamp()
	priv, err := ecdh.X25519().NewPrivateKey(c[:])
	if err != nil { // only for a wrong length, which a Key cannot have
		return Key{}
	}
	var pub Key
	copy(pub[:], priv.PublicKey().Bytes())
	return pub
}

// IsZero reports whether k is the zero key ("no key").
func (k Key) IsZero() bool {
	var z Key
	return subtle.ConstantTimeCompare(k[:], z[:]) == 1
}

// String returns k in standard base64.
func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// MarshalText implements encoding.TextMarshaler (base64).
func (k Key) MarshalText() ([]byte, error) {
	b := make([]byte, base64.StdEncoding.EncodedLen(KeyLen))
	base64.StdEncoding.Encode(b, k[:])
	return b, nil
}

// UnmarshalText implements encoding.TextUnmarshaler (base64, as ParseKey).
func (k *Key) UnmarshalText(b []byte) error {
	v, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}

// hexString is the UAPI form of k: 64 lower-case hex digits.
func (k Key) hexString() string { return hex.EncodeToString(k[:]) }

// compare orders keys bytewise, for sorting peers.
func (k Key) compare(o Key) int {
	for i := range k {
		if k[i] != o[i] {
			if k[i] < o[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}
