package crdt

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// readVectors parses testdata/vectors.txt: "== name" blocks of hex lines
// with "#" comments; a line "@name" includes an earlier vector's bytes.
func readVectors(t testing.TB) map[string][]byte {
	t.Helper()
	fh, err := os.Open("testdata/vectors.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	out := map[string][]byte{}
	var cur string
	sc := bufio.NewScanner(fh)
	for ln := 1; sc.Scan(); ln++ {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "== "); ok {
			cur = strings.TrimSpace(name)
			out[cur] = []byte{}
			continue
		}
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if cur == "" {
			t.Fatalf("vectors.txt:%d: bytes outside a vector", ln)
		}
		if ref, ok := strings.CutPrefix(line, "@"); ok {
			b, ok := out[ref]
			if !ok {
				t.Fatalf("vectors.txt:%d: unknown vector %q", ln, ref)
			}
			out[cur] = append(out[cur], b...)
			continue
		}
		b, err := hex.DecodeString(strings.ReplaceAll(line, " ", ""))
		if err != nil {
			t.Fatalf("vectors.txt:%d: %v", ln, err)
		}
		out[cur] = append(out[cur], b...)
	}
	return out
}

func fill(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

func ids(nb, sb byte) (NetworkID, ServiceID) {
	var n NetworkID
	var s ServiceID
	copy(n[:], fill(nb, 16))
	copy(s[:], fill(sb, 16))
	return n, s
}

func author(b byte) AuthorID {
	var a AuthorID
	copy(a[:], fill(b, 32))
	return a
}

// vectorFields are the values the golden vectors stand for.
func vectorFields() map[string]Field {
	n1, s1 := ids(0x01, 0x02)
	n2, s2 := ids(0xaa, 0xbb)
	n3, s3 := ids(0x11, 0x22)
	n4, s4 := ids(0x00, 0xff)
	return map[string]Field{
		"field-unsigned-minimal": {Network: n1, Service: s1, Key: "a", Lamport: 1, Author: author(0x03)},
		"field-unsigned-value-multibyte": {Network: n2, Service: s2, Key: "name", HasValue: true, Value: []byte("api"),
			Lamport: 300, Author: author(0xcc), Counter: 128},
		"field-signed-tombstone-bigvarints": {Network: n3, Service: s3, Key: TombstoneKey, Lamport: 1 << 32,
			Author: author(0x33), Counter: MaxClock, Signature: fill(0x44, 64)},
		"field-unsigned-long-key-empty-value": {Network: n4, Service: s4, Key: strings.Repeat("k", 130), HasValue: true,
			Value: []byte{}, Lamport: 127, Author: author(0x55), Counter: 1},
	}
}

// sigKey is the key of the signature vectors: seed = 32 × 0x07.
func sigKey() ed25519.PrivateKey { return ed25519.NewKeyFromSeed(fill(0x07, 32)) }

func TestGoldenEncoding(t *testing.T) {
	vec := readVectors(t)
	for name, f := range vectorFields() {
		t.Run(name, func(t *testing.T) {
			want, ok := vec[name]
			if !ok {
				t.Fatalf("no vector %q", name)
			}
			got := f.Encode()
			if !bytes.Equal(got, want) {
				t.Fatalf("encode:\n got %x\nwant %x", got, want)
			}
			if f.EncodedLen() != len(want) {
				t.Fatalf("EncodedLen %d, want %d", f.EncodedLen(), len(want))
			}
			lim := DefaultLimits()
			p, n, err := parseField(want, 0, &lim, true)
			if err != nil || n != len(want) {
				t.Fatalf("decode: %v (%d of %d)", err, n, len(want))
			}
			back := p.field()
			if !back.Equal(&f) {
				t.Fatalf("decode: got %v want %v", &back, &f)
			}
			if len(f.Signature) == SignatureSize {
				dec, err := DecodeField(want)
				if err != nil || !dec.Equal(&f) {
					t.Fatalf("DecodeField: %v %v", err, &dec)
				}
			}
		})
	}
	n3, s3 := ids(0x11, 0x22)
	snap := Snapshot{Network: n3, Service: s3, Fields: []Field{vectorFields()["field-signed-tombstone-bigvarints"]}}
	if got, want := snap.Encode(), vec["snapshot-deleted-service"]; !bytes.Equal(got, want) {
		t.Fatalf("snapshot encode:\n got %x\nwant %x", got, want)
	}
	dec, err := DecodeSnapshot(vec["snapshot-deleted-service"], nil)
	if err != nil || dec.Network != n3 || dec.Service != s3 || len(dec.Fields) != 1 || !dec.Fields[0].Equal(&snap.Fields[0]) {
		t.Fatalf("snapshot decode: %v %+v", err, dec)
	}
}

// TestGoldenSignatures pins Ed25519 signatures (deterministic, RFC 8032)
// of fields signed by sigKey: the signing message (domain + unsigned
// encoding) and the signed encoding.
func TestGoldenSignatures(t *testing.T) {
	vec := readVectors(t)
	for _, name := range []string{"field-unsigned-minimal", "field-unsigned-value-multibyte"} {
		t.Run(name, func(t *testing.T) {
			f := vectorFields()[name]
			Sign(sigKey(), &f)
			msg := f.AppendSigningMessage(nil)
			if want := vec["sig-message/"+name]; !bytes.Equal(msg, want) {
				t.Fatalf("signing message:\n got %x\nwant %x", msg, want)
			}
			if want := vec["sig-signed/"+name]; !bytes.Equal(f.Encode(), want) {
				t.Fatalf("signed field:\n got %x\nwant %x", f.Encode(), want)
			}
			if err := VerifySignature(&f); err != nil {
				t.Fatal(err)
			}
			dec, err := DecodeField(vec["sig-signed/"+name])
			if err != nil || VerifySignature(&dec) != nil {
				t.Fatalf("decoded golden field does not verify: %v", err)
			}
		})
	}
}
