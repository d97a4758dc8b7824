package crdt

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// rawField builds a field encoding member by member, so that single
// members can be made malformed.
type rawField struct {
	ids, key, value, lamport, author, counter, sig []byte
}

func goodRaw() rawField {
	return rawField{
		ids:     append(bytes.Clone(testNet[:]), fill(0x02, 16)...),
		key:     []byte{3, 'k', 'e', 'y'},
		value:   []byte{1, 2, 'o', 'k'},
		lamport: []byte{5},
		author:  fill(0x09, 32),
		counter: []byte{7},
		sig:     append([]byte{64}, fill(0x01, 64)...),
	}
}

func (r rawField) bytes() []byte {
	return bytes.Join([][]byte{r.ids, r.key, r.value, r.lamport, r.author, r.counter, r.sig}, nil)
}

// badFields is the table of malformed field encodings and their errors.
func badFields() []struct {
	name string
	b    []byte
	want error
} {
	with := func(f func(*rawField)) []byte { r := goodRaw(); f(&r); return r.bytes() }
	return []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"trailing", append(goodRaw().bytes(), 0), ErrTrailingBytes},
		{"overlong-lamport", with(func(r *rawField) { r.lamport = []byte{0x85, 0x00} }), ErrVarint},
		{"overlong-keylen", with(func(r *rawField) { r.key = []byte{0x83, 0x00, 'k', 'e', 'y'} }), ErrVarint},
		{"overflow-counter", with(func(r *rawField) { r.counter = append(fill(0xff, 9), 0x02) }), ErrVarint},
		{"eleven-byte-varint", with(func(r *rawField) { r.counter = append(fill(0x80, 10), 0x01) }), ErrVarint},
		{"option-tag-2", with(func(r *rawField) { r.value = []byte{2} }), ErrBadOption},
		{"empty-key", with(func(r *rawField) { r.key = []byte{0} }), ErrEmptyKey},
		{"key-too-long", with(func(r *rawField) { r.key = append([]byte{0x81, 0x02}, fill('k', 257)...) }), ErrKeyTooLong},
		{"value-too-large", with(func(r *rawField) { r.value = append([]byte{1, 0x81, 0x40}, fill('v', 8193)...) }), ErrValueTooLarge},
		{"key-len-past-end", with(func(r *rawField) {
			r.key = []byte{0x7f, 'k'}
			r.value, r.lamport, r.author, r.counter, r.sig = nil, nil, nil, nil, nil
		}), ErrTruncated},
		{"sig-63", with(func(r *rawField) { r.sig = append([]byte{63}, fill(1, 63)...) }), ErrSignatureLength},
		{"sig-empty", with(func(r *rawField) { r.sig = []byte{0} }), ErrSignatureLength},
		{"sig-huge-len", with(func(r *rawField) { r.sig = []byte{0xff, 0xff, 0xff, 0xff, 0x0f} }), ErrSignatureLength},
	}
}

func TestDecodeFieldBadInput(t *testing.T) {
	for _, tc := range badFields() {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeField(tc.b)
			mustIs(t, err, tc.want)
		})
	}
	good := goodRaw().bytes()
	if _, err := DecodeField(good); err != nil {
		t.Fatalf("good field: %v", err)
	}
	for n := 0; n < len(good); n++ {
		if _, err := DecodeField(good[:n]); !errors.Is(err, ErrTruncated) {
			t.Fatalf("prefix %d of %d: %v, want ErrTruncated", n, len(good), err)
		}
	}
}

func snapBytes(ver byte, n NetworkID, s ServiceID, count []byte, fields ...[]byte) []byte {
	b := append([]byte{ver}, n[:]...)
	b = append(b, s[:]...)
	b = append(b, count...)
	for _, f := range fields {
		b = append(b, f...)
	}
	return b
}

func badSnapshots() []struct {
	name string
	b    []byte
	want error
} {
	var svc ServiceID
	copy(svc[:], fill(0x02, 16))
	f := goodRaw().bytes()
	other := goodRaw()
	other.ids[20] ^= 1
	return []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"version-2", snapBytes(2, testNet, svc, []byte{1}, f), ErrUnknownVersion},
		{"version-overlong", append([]byte{0x81, 0x00}, snapBytes(1, testNet, svc, []byte{1}, f)[1:]...), ErrVarint},
		{"mixed-service", snapBytes(1, testNet, svc, []byte{2}, f, other.bytes()), ErrMixedSnapshot},
		{"too-many-fields", snapBytes(1, testNet, svc, []byte{0x82, 0x03}, f), ErrTooManyFields}, // 386: past MaxHeldFields+1
		{"count-past-end", snapBytes(1, testNet, svc, []byte{3}, f), ErrTruncated},
		{"trailing", append(snapBytes(1, testNet, svc, []byte{1}, f), 0), ErrTrailingBytes},
		{"bad-field", snapBytes(1, testNet, svc, []byte{1}, badFields()[2].b), ErrVarint},
		{"over-frame", append(snapBytes(1, testNet, svc, []byte{1}, f), make([]byte, DefaultMaxSnapshotBytes)...), ErrSnapshotTooLarge},
	}
}

func TestDecodeSnapshotBadInput(t *testing.T) {
	for _, tc := range badSnapshots() {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeSnapshot(tc.b, nil)
			mustIs(t, err, tc.want)
		})
	}
}

// TestMergeBadInputLeavesState merges every malformed snapshot into a
// replica and checks the error and that nothing changed.
func TestMergeBadInputLeavesState(t *testing.T) {
	ctx := context.Background()
	r := openReplica(t, 0, 3, nil)
	if _, err := r.Edit(ctx, testSvc(0), NoRevision, Edit{Key: "name", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	before := stateOf(r)
	lam := r.Lamport()
	for _, tc := range badSnapshots() {
		if _, err := r.MergeSnapshot(ctx, tc.b); !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if got := stateOf(r); !equalState(got, before) || r.Lamport() != lam {
			t.Fatalf("%s: state changed", tc.name)
		}
	}
}

func equalState(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func TestVarintRoundTrip(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 255, 300, 16383, 16384, 1<<32 - 1, 1 << 32, 1<<63 - 1, 1 << 63, ^uint64(0)} {
		b := appendUvarint(nil, v)
		if len(b) != uvarintLen(v) {
			t.Fatalf("%d: len %d vs %d", v, len(b), uvarintLen(v))
		}
		got, n, err := readUvarint(b, 0, 10, ^uint64(0))
		if err != nil || got != v || n != len(b) {
			t.Fatalf("%d: got %d n %d err %v", v, got, n, err)
		}
	}
	if _, _, err := readUvarint([]byte{0xff, 0xff, 0xff, 0xff, 0x10}, 0, 5, 1<<32-1); !errors.Is(err, ErrVarint) {
		t.Fatalf("u32 overflow: %v", err)
	}
}

func FuzzDecodeField(f *testing.F) {
	for _, v := range readVectors(f) {
		f.Add(v)
	}
	for _, tc := range badFields() {
		f.Add(tc.b)
	}
	f.Add(goodRaw().bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeField(b)
		if err != nil {
			return
		}
		// The decoder accepts only canonical encodings: re-encoding gives
		// the input back, and decoding that gives the same field.
		enc := got.Encode()
		if !bytes.Equal(enc, b) {
			t.Fatalf("re-encode differs:\n in %x\nout %x", b, enc)
		}
		again, err := DecodeField(enc)
		if err != nil || !again.Equal(&got) {
			t.Fatalf("decode(encode(x)) != x: %v", err)
		}
	})
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(readVectors(f)["snapshot-deleted-service"])
	for _, tc := range badSnapshots() {
		if len(tc.b) < 4096 {
			f.Add(tc.b)
		}
	}
	snap := Snapshot{Network: testNet, Service: testSvc(1), Fields: []Field{
		mkField(0, testSvc(1), "a", "1", 1, 1), mkField(1, testSvc(1), "b", "\x00none", 2, 9)}}
	f.Add(snap.Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSnapshot(b, nil)
		if err != nil {
			return
		}
		enc := s.Encode()
		if !bytes.Equal(enc, b) {
			t.Fatalf("re-encode differs")
		}
		again, err := DecodeSnapshot(enc, nil)
		if err != nil || len(again.Fields) != len(s.Fields) {
			t.Fatalf("decode(encode(x)): %v", err)
		}
		for i := range again.Fields {
			if !again.Fields[i].Equal(&s.Fields[i]) {
				t.Fatalf("field %d differs", i)
			}
		}
	})
}

// FuzzMergeSnapshot merges arbitrary bytes into a replica holding state:
// no panic; a refused snapshot leaves the state unchanged; an accepted one
// leaves a state that survives reopening the store.
func FuzzMergeSnapshot(f *testing.F) {
	svc := testSvc(1)
	snap := Snapshot{Network: testNet, Service: svc, Fields: []Field{
		mkField(0, svc, "a", "1", 1, 1), mkField(1, svc, "b", "\x00none", 2, 9), mkField(2, svc, "c", "zz", 3, 4)}}
	good := snap.Encode()
	f.Add(good)
	tomb := Snapshot{Network: testNet, Service: svc, Fields: []Field{mkField(1, svc, TombstoneKey, "\x00none", 9, 10)}}
	f.Add(tomb.Encode())
	flipped := bytes.Clone(good)
	flipped[len(flipped)-3] ^= 1
	f.Add(flipped)
	for _, tc := range badSnapshots() {
		if len(tc.b) < 4096 {
			f.Add(tc.b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx := context.Background()
		st := NewMemStore()
		r, err := Open(ctx, Config{Network: testNet, Members: testMembers(3), Signer: testKey(0), Store: st})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Edit(ctx, svc, NoRevision, Edit{Key: "a", Value: []byte("held")}); err != nil {
			t.Fatal(err)
		}
		before := stateOf(r)
		res, err := r.MergeSnapshot(ctx, b)
		after := stateOf(r)
		if len(res.Changed) == 0 && !equalState(before, after) {
			t.Fatalf("state changed without a reported change (err %v)", err)
		}
		if err != nil && strings.Contains(err.Error(), "refused") && !equalState(before, after) {
			t.Fatalf("refused snapshot changed state: %v", err)
		}
		_ = r.Close()
		r2, err := Open(ctx, Config{Network: testNet, Members: testMembers(3), Store: st.Reopen()})
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer r2.Close()
		if !equalState(stateOf(r2), after) {
			t.Fatal("reopened state differs")
		}
	})
}
