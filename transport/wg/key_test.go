package wg

import (
	"encoding/hex"
	"errors"
	"testing"
)

// RFC 7748 section 6.1.
const (
	rfcAlicePriv = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
	rfcAlicePub  = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
)

func TestPublicKeyRFC7748(t *testing.T) {
	priv, err := parseHexKey(rfcAlicePriv)
	if err != nil {
		t.Fatal(err)
	}
	pub := priv.PublicKey()
	if got := hex.EncodeToString(pub[:]); got != rfcAlicePub {
		t.Fatalf("public key %s, want %s", got, rfcAlicePub)
	}
}

func TestGeneratePrivateKey(t *testing.T) {
	a, b := GeneratePrivateKey(), GeneratePrivateKey()
	if a == b || a.IsZero() {
		t.Fatal("two generated keys are equal or zero")
	}
	if a[0]&7 != 0 || a[31]&128 != 0 || a[31]&64 == 0 {
		t.Fatalf("key not clamped: %x", a)
	}
	if a.PublicKey() == b.PublicKey() || a.PublicKey().IsZero() {
		t.Fatal("public keys collide or are zero")
	}
}

var parseKeyTable = []struct {
	in  string
	err error
}{
	{"dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=", nil},
	{"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", nil}, // zero parses; Validate refuses it
	{"", ErrBadKey},
	{"dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo", ErrBadKey},   // no padding
	{"dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LC!=", ErrBadKey},  // bad character
	{"dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo==", ErrBadKey}, // too long
	{"77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a", ErrBadKey},
	{"00000000000000000000000000000000000000000000", ErrBadKey}, // 33 bytes, no padding (found by fuzzing)
}

func TestParseKey(t *testing.T) {
	for _, tc := range parseKeyTable {
		k, err := ParseKey(tc.in)
		if !errors.Is(err, tc.err) {
			t.Errorf("ParseKey(%q) error %v, want %v", tc.in, err, tc.err)
			continue
		}
		if err == nil && k.String() != tc.in {
			t.Errorf("ParseKey(%q).String() = %q", tc.in, k.String())
		}
	}
	k := GeneratePrivateKey()
	var back Key
	text, _ := k.MarshalText()
	if err := back.UnmarshalText(text); err != nil || back != k {
		t.Fatalf("text round trip: %v, %v != %v", err, back, k)
	}
	if err := back.UnmarshalText([]byte("nope")); !errors.Is(err, ErrBadKey) {
		t.Fatalf("UnmarshalText(nope) = %v", err)
	}
}

func FuzzParseKey(f *testing.F) {
	for _, tc := range parseKeyTable {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			if !errors.Is(err, ErrBadKey) {
				t.Fatalf("error %v does not match ErrBadKey", err)
			}
			return
		}
		k2, err := ParseKey(k.String())
		if err != nil || k2 != k {
			t.Fatalf("round trip of %q: %v", s, err)
		}
	})
}

func FuzzParseHexKey(f *testing.F) {
	f.Add(rfcAlicePriv)
	f.Add("")
	f.Add("zz")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := parseHexKey(s)
		if err != nil {
			if !errors.Is(err, ErrBadKey) {
				t.Fatalf("error %v does not match ErrBadKey", err)
			}
			return
		}
		if k2, err := parseHexKey(k.hexString()); err != nil || k2 != k {
			t.Fatalf("round trip of %q: %v", s, err)
		}
	})
}
