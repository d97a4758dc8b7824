package vip

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

// FuzzParseKey: the key parser never panics, and what it accepts prints
// back to the same key.
func FuzzParseKey(f *testing.F) {
	for _, k := range []string{"L/tcp/443", "L/udp/53/7/cfg", "L/tcp/443/18446744073709551615/b/" + strings.Repeat("ab", 32) + "/8443", "L/tcp/0", "L//", "name"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		pk, err := parseKey(key)
		if err != nil {
			return
		}
		var back string
		switch pk.kind {
		case 'l':
			back = listenerKey(pk.port)
		case 'c':
			back = cfgKey(pk.port, pk.gen)
		case 'b':
			back = backendKey(pk.port, pk.gen, pk.backend)
		}
		if back != key {
			t.Fatalf("parseKey(%q) = %+v, which prints as %q", key, pk, back)
		}
	})
}

// FuzzDecodeValues: the listener and cfg decoders never panic, and what
// they accept encodes back to the same bytes.
func FuzzDecodeValues(f *testing.F) {
	f.Add(encodeListener(7, true))
	f.Add(encodeListener(math.MaxUint64, false))
	f.Add(encodeCfg(Check{Interval: Duration(3e9), Failures: 3}, Duration(60e9)))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0})
	f.Fuzz(func(t *testing.T, v []byte) {
		if gen, removed, err := decodeListener(v); err == nil {
			if got := encodeListener(gen, removed); string(got) != string(v) {
				t.Fatalf("listener %x decodes to (%d, %v), which encodes as %x", v, gen, removed, got)
			}
		}
		if c, idle, err := decodeCfg(v); err == nil {
			if got := encodeCfg(c, idle); string(got) != string(v) {
				t.Fatalf("cfg %x decodes to %+v %v, which encodes as %x", v, c, idle, got)
			}
		}
	})
}

// schemaFuzzKeys are key shapes of the schema for the hostile fuzzer.
func schemaFuzzKeys(r *schemaReader, node NodeID) string {
	pk := PortKey{Proto: []Proto{TCP, UDP}[r.n(2)], Port: uint16(r.n(3) + 80)}
	gen := r.gen()
	switch r.n(7) {
	case 0:
		return keyName
	case 1:
		return keyAddr
	case 2, 3:
		return listenerKey(pk)
	case 4:
		return cfgKey(pk, gen)
	case 5:
		return backendKey(pk, gen, Backend{node, uint16(r.n(4) + 1)})
	}
	return string(r.bytes(10))
}

type schemaReader struct{ b []byte }

func (r *schemaReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *schemaReader) n(n int) int { return int(r.byte()) % n }

func (r *schemaReader) bytes(max int) []byte {
	out := make([]byte, r.n(max+1))
	for i := range out {
		out[i] = r.byte()
	}
	return out
}

func (r *schemaReader) gen() uint64 {
	switch r.n(6) {
	case 0:
		return MaxGeneration
	case 1:
		return MaxGeneration + 1
	case 2:
		return math.MaxUint64
	case 3:
		return MaxGeneration - 1
	}
	return uint64(r.n(8))
}

func (r *schemaReader) value(key string) ([]byte, bool) {
	if r.n(5) == 0 {
		return nil, false
	}
	switch {
	case r.n(3) == 0:
		return r.bytes(24), true
	case key == keyName:
		return []byte([]string{"api", "evil\x1b[2J", "x", strings.Repeat("a", 70)}[r.n(4)]), true
	case strings.HasSuffix(key, "/cfg"):
		return encodeCfg(Check{Interval: Duration(r.n(5)) * 1e9, Failures: r.n(200)}, Duration(r.n(3))*1e9), true
	case strings.Count(key, "/") == 2:
		return encodeListener(r.gen(), r.n(2) == 0), true
	}
	return []byte{}, true
}

// FuzzHostileSchemaFields is the structure-aware fuzzer of the vip schema
// that holds member keys: it builds fields of the schema's shapes with
// hostile generations, clocks and values, signs them with a member's key
// and merges them into a registry's replica (with the schema's hooks), as
// snapshots or live fields. Invariants: no panic, decoding every held
// service works or reports ErrSchema, the held state stays within the
// hard caps, and afterwards an honest member can still create a service
// and add, change and remove listeners on every service the hostile
// fields did not name.
func FuzzHostileSchemaFields(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 2, 0, 0, 0, 3, 1, 1, 0, 2, 2, 2, 5})
	f.Add([]byte{0, 5, 0, 2, 9, 9, 9, 0, 4, 1, 1, 1, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		ctx := context.Background()
		tn := newTestNet(t, 2, 11)
		reg := tn.regs[0]
		honest, err := reg.Create(ctx, "honest")
		if err != nil {
			t.Fatal(err)
		}
		victims := make([]ServiceID, 3)
		for i := range victims {
			binary.BigEndian.PutUint64(victims[i][8:], uint64(i+1))
		}
		r := &schemaReader{b: in}
		var batch []crdt.Field
		for steps := 0; len(r.b) > 0 && steps < 150; steps++ {
			key := schemaFuzzKeys(r, tn.nodes[r.n(2)].ID)
			if key == "" {
				key = "x"
			}
			val, has := r.value(key)
			if !has {
				val = nil
			}
			lamport := []uint64{1, 2, 1 << 40, crdt.MaxClock - 1, crdt.MaxClock}[r.n(5)]
			batch = append(batch, tn.hostileField(1, victims[r.n(len(victims))], key, val, lamport))
			if r.n(4) == 0 {
				if r.n(2) == 0 {
					_, _ = tn.mergeInto(0, batch...)
				} else {
					for _, fl := range batch {
						snap := crdt.Snapshot{Network: fl.Network, Service: fl.Service, Fields: []crdt.Field{fl}}
						_, _ = reg.Replica().MergeSnapshot(ctx, snap.Encode())
					}
					reg.Refresh()
				}
				batch = nil
			}
		}
		_, _ = tn.mergeInto(0, batch...)
		lim := reg.Replica().Limits()
		for _, v := range reg.List() {
			if info, _ := reg.Replica().Service(crdt.ServiceID(v.ID)); info.Fields > 2*lim.MaxFieldsPerService {
				t.Fatalf("service %s holds %d fields", v.ID, info.Fields)
			}
			if strings.ContainsAny(v.Name, "\x1b\x00\n") {
				t.Fatalf("service %s has name %q", v.ID, v.Name)
			}
		}
		// The honest member's service, and a new one, still work.
		if _, err := reg.PortAdd(ctx, honest.ID.String(), PortKey{TCP, 443}, []Backend{{tn.nodes[0].ID, 8443}}); err != nil {
			t.Fatalf("honest PortAdd: %v", err)
		}
		if _, err := reg.BackendAdd(ctx, honest.ID.String(), PortKey{TCP, 443}, Backend{tn.nodes[1].ID, 8443}); err != nil {
			t.Fatalf("honest BackendAdd: %v", err)
		}
		if _, err := reg.PortRemove(ctx, honest.ID.String(), PortKey{TCP, 443}); err != nil {
			t.Fatalf("honest PortRemove: %v", err)
		}
		v, err := reg.Create(ctx, fmt.Sprintf("new%d", len(in)%7))
		if err != nil {
			t.Fatalf("honest Create: %v", err)
		}
		if v, err = reg.PortAdd(ctx, v.ID.String(), PortKey{UDP, 53}, []Backend{{tn.nodes[1].ID, 5353}}); err != nil || !v.Routable {
			t.Fatalf("honest PortAdd on a new service: %v %+v", err, v)
		}
	})
}

// FuzzDecodeService: decodeService never panics on any set of fields and
// either decodes or reports ErrSchema; CheckField accepts only fields that
// decode.
func FuzzDecodeService(f *testing.F) {
	f.Add([]byte{2, 0, 1, 3, 4})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := &schemaReader{b: in}
		var fields []crdt.Field
		for len(r.b) > 0 && len(fields) < 64 {
			key := schemaFuzzKeys(r, NodeID{1})
			val, has := r.value(key)
			fl := crdt.Field{Key: key, HasValue: has, Value: val}
			if CheckField(&fl) != nil {
				continue
			}
			_ = Rank(&fl)
			fields = append(fields, fl)
		}
		_, _ = decodeService("home", ServiceID{1}, fields)
		_ = Obsolete(crdt.ServiceID{1}, fields)
	})
}
