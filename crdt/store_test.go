package crdt

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"testing"
)

func TestMetaRecord(t *testing.T) {
	m := meta{network: testNet, lamport: 300, counter: map[AuthorID]uint64{authorOf(testKey(1)): 7, authorOf(testKey(0)): 1 << 40},
		members: memberSet(testMembers(3)), former: map[AuthorID]uint64{authorOf(testKey(5)): 9, authorOf(testKey(6)): MaxClock}}
	rec := encodeMeta(&m)
	got, err := decodeMeta(rec)
	if err != nil || got.network != m.network || got.lamport != 300 || len(got.counter) != 2 ||
		got.counter[authorOf(testKey(1))] != 7 || got.counter[authorOf(testKey(0))] != 1<<40 || got.version != 2 ||
		!slices.Equal(got.members, m.members) || !maps.Equal(got.former, m.former) {
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
	v4 := appendCRC(append([]byte{4}, rec[1:len(rec)-4]...), 0)
	if _, err := decodeMeta(v4); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("version 4: %v", err)
	}
	// Version 3 carries the compaction state, and only then is written.
	m3 := m
	m3.acked, m3.cert = []byte{1, 2}, []byte{3}
	rec3 := encodeMeta(&m3)
	got3, err := decodeMeta(rec3)
	if err != nil || got3.version != 3 || !bytes.Equal(got3.acked, m3.acked) || !bytes.Equal(got3.cert, m3.cert) {
		t.Fatalf("version 3: %+v %v", got3, err)
	}
	for n := 0; n < len(rec3); n++ {
		if _, err := decodeMeta(rec3[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("version 3 prefix %d: %v", n, err)
		}
	}
	// A former member's last counter above MaxClock is corrupt.
	m.former[authorOf(testKey(6))] = MaxClock + 1
	if _, err := decodeMeta(encodeMeta(&m)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("last counter above MaxClock: %v", err)
	}
}

// encodeMetaV1 is the version-1 meta record: no members, no former list.
func encodeMetaV1(m *meta) []byte {
	b := appendUvarint(nil, 1)
	b = append(b, m.network[:]...)
	b = appendUvarint(b, m.lamport)
	b = appendAuthorMap(b, m.counter)
	return appendCRC(b, 0)
}

// TestMetaRecordV1: a version-1 record decodes with no member set and
// no former list; its CRC and truncation rules hold as for version 2.
func TestMetaRecordV1(t *testing.T) {
	m := meta{network: testNet, lamport: 300, counter: map[AuthorID]uint64{authorOf(testKey(1)): 7}}
	rec := encodeMetaV1(&m)
	got, err := decodeMeta(rec)
	if err != nil || got.version != 1 || got.lamport != 300 || got.counter[authorOf(testKey(1))] != 7 || got.members != nil || len(got.former) != 0 {
		t.Fatalf("version 1: %+v %v", got, err)
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
}

// TestMetaRecordMembersOrder: the member and former vectors must be in
// strict author order.
func TestMetaRecordMembersOrder(t *testing.T) {
	a, b := authorOf(testKey(0)), authorOf(testKey(1))
	if bytes.Compare(a[:], b[:]) > 0 {
		a, b = b, a
	}
	for _, tc := range []struct {
		name string
		m    meta
	}{
		{"members", meta{network: testNet, members: []AuthorID{b, a}}},
		{"members repeated", meta{network: testNet, members: []AuthorID{a, a}}},
	} {
		if _, err := decodeMeta(encodeMeta(&tc.m)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	rec := appendUvarint(nil, metaVersion)
	rec = append(rec, testNet[:]...)
	rec = append(rec, 1, 0, 0, 2)
	rec = append(append(rec, b[:]...), 1)
	rec = append(append(rec, a[:]...), 1)
	if _, err := decodeMeta(appendCRC(rec, 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("unsorted former members: %v", err)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	m := meta{network: testNet, lamport: 300, counter: map[AuthorID]uint64{authorOf(testKey(1)): 7}}
	f.Add(encodeMeta(&m))
	f.Add(encodeMeta(&meta{}))
	f.Add(encodeMetaV1(&m))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeMeta(b)
		if err != nil {
			return
		}
		enc := encodeMeta(&got)
		if got.version == 1 {
			enc = encodeMetaV1(&got)
		}
		if !bytes.Equal(enc, b) {
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
