package crdt

import (
	"bytes"
	"errors"
	"testing"
)

func TestMetaRecord(t *testing.T) {
	m := meta{network: testNet, lamport: 300, counter: map[AuthorID]uint64{authorOf(testKey(1)): 7, authorOf(testKey(0)): 1 << 40}}
	rec := encodeMeta(&m)
	got, err := decodeMeta(rec)
	if err != nil || got.network != m.network || got.lamport != 300 || len(got.counter) != 2 ||
		got.counter[authorOf(testKey(1))] != 7 || got.counter[authorOf(testKey(0))] != 1<<40 {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if !bytes.Equal(encodeMeta(&got), rec) {
		t.Fatal("meta encoding not canonical")
	}
	for i := range rec {
		bad := bytes.Clone(rec)
		bad[i] ^= 0x10
		if _, err := decodeMeta(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flipped byte %d: %v", i, err)
		}
	}
	for n := 0; n < len(rec); n++ {
		if _, err := decodeMeta(rec[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("prefix %d: %v", n, err)
		}
	}
	// A record with a good checksum but another version.
	v2 := appendCRC(append([]byte{2}, rec[1:len(rec)-4]...), 0)
	if _, err := decodeMeta(v2); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("version 2: %v", err)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	m := meta{network: testNet, lamport: 300, counter: map[AuthorID]uint64{authorOf(testKey(1)): 7}}
	f.Add(encodeMeta(&m))
	f.Add(encodeMeta(&meta{}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeMeta(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeMeta(&got), b) {
			t.Fatalf("re-encode differs")
		}
	})
}

func TestMetaRecordOrder(t *testing.T) {
	a, b := authorOf(testKey(0)), authorOf(testKey(1))
	if bytes.Compare(a[:], b[:]) > 0 {
		a, b = b, a
	}
	rec := appendUvarint(nil, metaVersion)
	rec = append(rec, testNet[:]...)
	rec = append(rec, 1, 2)
	rec = append(append(rec, b[:]...), 1)
	rec = append(append(rec, a[:]...), 1)
	if _, err := decodeMeta(appendCRC(rec, 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("unsorted counters: %v", err)
	}
}
