package vip

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vipkit/vipkit/crdt"
)

// The field schema maps a Service onto crdt registers. crdt knows nothing of
// it; vip owns it. Keys, all ASCII:
//
//	name                               the service's name (value: the name's bytes)
//	addr                               the stored address reservation (value: 4 bytes, IPv4)
//	L/<proto>/<port>                   the listener register (value: listenerValue)
//	L/<proto>/<port>/<gen>/cfg         the listener's check settings and idle timeout (value: cfgValue)
//	L/<proto>/<port>/<gen>/b/<node>/<port>  a backend: node id in hex, app port
//	                                   (a value when present: empty, or backendValue
//	                                   when draining; cleared when removed)
//	L/floor                            the service's port floor (value: floorValue)
//
// <gen> is the listener's generation in decimal, at most MaxGeneration.
// Adding a listener writes its register with the next generation of its
// port (one above the highest generation held for the port); removing it
// writes the register with the same generation and the removed flag.
// Backend and cfg fields carry the generation in their key, so those of a
// removed listener never reappear when its port is added again: the new
// generation has new keys.
//
// Removing a backend also moves its listener to the port's next
// generation, with only the live backends (and cfg) written at it: every
// field of the old generation, the removed backend's included, is then
// obsolete and dropped, and a replay of it stays obsolete. So backend
// churn holds only the live backends' fields. The cost: an edit another
// member makes concurrently at the old generation (adding, draining or
// removing a backend, changing cfg, removing the listener) is lost once
// it meets the new generation; the members converge on the new one.
//
// Removing a listener raises the service's port floor (key L/floor) to
// the removed generation (the highest, when several go at once), writes
// the removed register at the floor, and moves every other listener at
// or below the floor to its port's next generation, which is above the
// floor. Every listener field at or below the floor is obsolete, except
// a removed register exactly at it: so the registers of earlier removals
// are dropped, and a replay of a removed port's fields (its live register
// above all) stays dropped, while distinct-port churn holds only the live
// listeners, the floor and the latest removal's registers. The latest
// removal stays so that agents without the floor, which refuse L/floor,
// still learn of it. The cost: an edit another member makes concurrently
// at or below the new floor is lost once it meets the floor (a backend or
// cfg change of a moved listener, its removal, or a listener added at a
// generation at or below the floor). When the floor cannot be raised
// (a generation at the bound), a removal writes its register alone, as
// before the floor existed.
//
// Concurrent edits of different backends are different registers, so they
// merge; concurrent edits of one register resolve by crdt's order, with
// the listener register ranked first by generation and removal (Rank): a
// higher generation wins whatever its clock, and at one generation the
// removal wins, so that no later field makes a removed generation live.
//
// Obsolete fields: for each port, let G be the highest generation that
// appears in any held field of that port (the register's value or a key).
// Every cfg or backend field of a lower generation is obsolete and dropped,
// and so is every one of the register's generation once it is removed.
// Let F be the held port floor (0 without one). When F > 0, every cfg,
// backend and live register field of a generation at most F is obsolete,
// and so is every removed register below F. All three only grow as fields
// are added (G by its definition, the removal because a removal outranks
// its generation's live value, F because the floor register ranks by its
// value), so the rule is monotonic, as crdt requires: every replica drops
// the same fields whatever the arrival order. A field dropped by the floor
// has a generation at most F, so a G that falls when it goes covers nothing
// the floor does not. The register of a removed listener above the floor
// stays, so that the removal stays final; at or below it the floor does.
//
// Bounds (wire-format constants, the same on every replica): generations
// are at most MaxGeneration, and CheckField refuses a field beyond it on
// merge. A field at the bound pins its port: no higher generation can be
// written, so adding a listener on that port fails with ErrLimit; every
// other port and service is unaffected, and deleting the service
// recovers. Stored fields from before the bound existed are kept; a
// service holding one decodes with ErrSchema and is left out of routing.
const (
	keyName   = "name"
	keyAddr   = "addr"
	keyPrefix = "L/"
	// keyFloor is under keyPrefix, but no listener key has its shape, so
	// agents without the floor refuse it (ErrSchema) instead of storing
	// it and taking the service out of routing (docs/wire.md).
	keyFloor = keyPrefix + "floor"
)

// Value encodings (version byte first, so a later schema can extend them):
//
//	listenerValue: 0x01, generation uvarint, flags byte (bit 0: removed)
//	backendValue:  empty (serving), or 0x01, flags byte (bit 0: draining;
//	               0 and other bits are refused: not draining is empty)
//	floorValue:    0x01, floor uvarint (at most MaxGeneration)
//	cfgValue:      0x01, port-check byte (0 default, 1 on, 2 off),
//	               interval ms uvarint, timeout ms uvarint, failures uvarint,
//	               successes uvarint, idle timeout ms uvarint (0 = default)
const schemaVersion = 1

// ErrSchema means a field's key or value does not follow the schema. On merge
// CheckField refuses such a field (it is counted and never stored); a
// held one (written before a check existed) makes its service be
// reported with the error and left out of routing.
var ErrSchema = errors.New("vip: field does not follow the schema")

// MaxGeneration is the largest listener generation a field may carry: the
// same bound as crdt's clocks, so that twice a generation plus the
// removal flag fits the rank.
const MaxGeneration = crdt.MaxClock

// CheckField is the schema's check for crdt.Config.Check: it refuses a
// field whose key or value does not follow the schema, or that carries a
// generation above MaxGeneration, or a name that is not a valid name (so
// no control characters or terminal escapes ever reach a replica). It
// reads only the field, so every replica refuses the same fields. Keys
// the schema does not know are accepted when they are printable ASCII
// (a newer schema's), and make their service be reported.
func CheckField(f *crdt.Field) error {
	switch f.Key {
	case keyName:
		if f.HasValue {
			if err := ValidName(string(f.Value)); err != nil {
				return fmt.Errorf("%w: name: %v", ErrSchema, err)
			}
		}
		return nil
	case keyAddr:
		if f.HasValue && len(f.Value) != 4 {
			return fmt.Errorf("%w: addr value of %d bytes", ErrSchema, len(f.Value))
		}
		return nil
	case keyFloor:
		if f.HasValue {
			fl, err := decodeFloor(f.Value)
			if err != nil {
				return err
			}
			if fl > MaxGeneration {
				return fmt.Errorf("%w: port floor %d above %d", ErrSchema, fl, MaxGeneration)
			}
		}
		return nil
	}
	if !strings.HasPrefix(f.Key, keyPrefix) {
		for i := 0; i < len(f.Key); i++ {
			if c := f.Key[i]; c < 0x21 || c > 0x7e {
				return fmt.Errorf("%w: key %q is not printable ASCII", ErrSchema, f.Key)
			}
		}
		return nil
	}
	pk, err := parseKey(f.Key)
	if err != nil {
		return err
	}
	if pk.gen > MaxGeneration {
		return fmt.Errorf("%w: key %q: generation above %d", ErrSchema, f.Key, MaxGeneration)
	}
	if !f.HasValue {
		return nil
	}
	switch pk.kind {
	case 'l':
		gen, _, err := decodeListener(f.Value)
		if err != nil {
			return err
		}
		if gen > MaxGeneration {
			return fmt.Errorf("%w: listener %s: generation %d above %d", ErrSchema, pk.port, gen, MaxGeneration)
		}
	case 'c':
		if _, _, err := decodeCfg(f.Value); err != nil {
			return err
		}
	case 'b':
		if _, err := decodeBackendValue(f.Value); err != nil {
			return err
		}
	}
	return nil
}

// backendDrain is the value of a draining backend's field
// (docs/backend-drain.md); a serving backend's value is empty.
var backendDrain = []byte{schemaVersion, 1}

func encodeBackendValue(drain bool) []byte {
	if drain {
		return slices.Clone(backendDrain)
	}
	return []byte{}
}

func decodeBackendValue(v []byte) (drain bool, err error) {
	switch {
	case len(v) == 0:
		return false, nil
	case bytes.Equal(v, backendDrain):
		return true, nil
	}
	return false, fmt.Errorf("%w: backend value %x", ErrSchema, v)
}

// Rank is the schema's precedence for crdt.Config.Rank: a listener
// register ranks by generation, and at one generation its removal above
// its live value; the port floor ranks by its value, so the highest floor
// wins whatever its clock; every other field ranks 0.
func Rank(f *crdt.Field) uint64 {
	if f.Key == keyFloor {
		if !f.HasValue {
			return 0
		}
		fl, err := decodeFloor(f.Value)
		if err != nil {
			return 0
		}
		return min(fl, MaxGeneration)
	}
	if !f.HasValue || !strings.HasPrefix(f.Key, keyPrefix) || strings.Count(f.Key, "/") != 2 {
		return 0
	}
	gen, removed, err := decodeListener(f.Value)
	if err != nil {
		return 0
	}
	r := min(gen, MaxGeneration) * 2
	if removed {
		r++
	}
	return r
}

func listenerKey(k PortKey) string {
	return keyPrefix + k.Proto.String() + "/" + strconv.Itoa(int(k.Port))
}

func cfgKey(k PortKey, gen uint64) string {
	return listenerKey(k) + "/" + strconv.FormatUint(gen, 10) + "/cfg"
}

func backendKey(k PortKey, gen uint64, b Backend) string {
	return listenerKey(k) + "/" + strconv.FormatUint(gen, 10) + "/b/" + b.Node.String() + "/" + strconv.Itoa(int(b.Port))
}

func encodeListener(gen uint64, removed bool) []byte {
	b := []byte{schemaVersion}
	b = binary.AppendUvarint(b, gen)
	flags := byte(0)
	if removed {
		flags = 1
	}
	return append(b, flags)
}

func decodeListener(v []byte) (gen uint64, removed bool, err error) {
	if len(v) < 3 || v[0] != schemaVersion {
		return 0, false, fmt.Errorf("%w: listener value %x", ErrSchema, v)
	}
	gen, n := binary.Uvarint(v[1:])
	if n <= 0 || 1+n+1 != len(v) || v[1+n] > 1 || n != len(binary.AppendUvarint(nil, gen)) {
		return 0, false, fmt.Errorf("%w: listener value %x", ErrSchema, v)
	}
	return gen, v[1+n] == 1, nil
}

func encodeFloor(fl uint64) []byte {
	return binary.AppendUvarint([]byte{schemaVersion}, fl)
}

func decodeFloor(v []byte) (uint64, error) {
	if len(v) < 2 || v[0] != schemaVersion {
		return 0, fmt.Errorf("%w: floor value %x", ErrSchema, v)
	}
	fl, n := binary.Uvarint(v[1:])
	if n <= 0 || 1+n != len(v) || n != len(binary.AppendUvarint(nil, fl)) {
		return 0, fmt.Errorf("%w: floor value %x", ErrSchema, v)
	}
	return fl, nil
}

// floorOf returns the port floor held among fields, 0 without one.
func floorOf(fields []crdt.Field) uint64 {
	for i := range fields {
		if f := &fields[i]; f.Key == keyFloor && f.HasValue {
			if fl, err := decodeFloor(f.Value); err == nil {
				return fl
			}
		}
	}
	return 0
}

func encodeCfg(c Check, idle Duration) []byte {
	b := []byte{schemaVersion, 0}
	if c.PortCheck != nil {
		if *c.PortCheck {
			b[1] = 1
		} else {
			b[1] = 2
		}
	}
	for _, v := range []uint64{
		uint64(time.Duration(c.Interval) / time.Millisecond),
		uint64(time.Duration(c.Timeout) / time.Millisecond),
		uint64(c.Failures), uint64(c.Successes),
		uint64(time.Duration(idle) / time.Millisecond),
	} {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

func decodeCfg(v []byte) (Check, Duration, error) {
	bad := fmt.Errorf("%w: cfg value %x", ErrSchema, v)
	if len(v) < 2 || v[0] != schemaVersion || v[1] > 2 {
		return Check{}, 0, bad
	}
	var c Check
	switch v[1] {
	case 1:
		c.PortCheck = boolPtr(true)
	case 2:
		c.PortCheck = boolPtr(false)
	}
	rest := v[2:]
	var nums [5]uint64
	for i := range nums {
		x, n := binary.Uvarint(rest)
		if n <= 0 || x > 1<<40 {
			return Check{}, 0, bad
		}
		nums[i] = x
		rest = rest[n:]
	}
	if len(rest) != 0 || nums[2] > MaxCheckCount || nums[3] > MaxCheckCount {
		return Check{}, 0, bad
	}
	c.Interval = Duration(time.Duration(nums[0]) * time.Millisecond)
	c.Timeout = Duration(time.Duration(nums[1]) * time.Millisecond)
	c.Failures, c.Successes = int(nums[2]), int(nums[3])
	idle := Duration(time.Duration(nums[4]) * time.Millisecond)
	if !bytes.Equal(encodeCfg(c, idle), v) {
		return Check{}, 0, bad // not the canonical (shortest) encoding
	}
	return c, idle, nil
}

func boolPtr(v bool) *bool { return &v }

// parsedKey is a listener-scoped key taken apart.
type parsedKey struct {
	port    PortKey
	gen     uint64 // for cfg and backend keys
	kind    byte   // 'l' listener register, 'c' cfg, 'b' backend
	backend Backend
}

// badKey is parseKey's error, made only on failure (parseKey runs for
// every listener field of every edit).
func badKey(key string) error { return fmt.Errorf("%w: key %q", ErrSchema, key) }

func parseKey(key string) (parsedKey, error) {
	rest, ok := strings.CutPrefix(key, keyPrefix)
	if !ok {
		return parsedKey{}, fmt.Errorf("%w: key %q", ErrSchema, key)
	}
	parts := strings.Split(rest, "/")
	if len(parts) < 2 {
		return parsedKey{}, badKey(key)
	}
	pk, err := ParsePortKey(parts[0] + "/" + parts[1])
	if err != nil || pk.String() != parts[0]+"/"+parts[1] {
		return parsedKey{}, badKey(key)
	}
	if len(parts) == 2 {
		return parsedKey{port: pk, kind: 'l'}, nil
	}
	gen, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil || strconv.FormatUint(gen, 10) != parts[2] {
		return parsedKey{}, badKey(key)
	}
	switch {
	case len(parts) == 4 && parts[3] == "cfg":
		return parsedKey{port: pk, gen: gen, kind: 'c'}, nil
	case len(parts) == 6 && parts[3] == "b":
		node, err := ParseNodeID(parts[4])
		if err != nil || node.String() != parts[4] {
			return parsedKey{}, badKey(key)
		}
		port, err := parsePort(parts[5])
		if err != nil || strconv.Itoa(int(port)) != parts[5] {
			return parsedKey{}, badKey(key)
		}
		return parsedKey{port: pk, gen: gen, kind: 'b', backend: Backend{node, port}}, nil
	}
	return parsedKey{}, badKey(key)
}

// portGen is what a service's held fields say of one port's generations.
type portGen struct {
	max     uint64 // the highest generation in any field of the port
	reg     uint64 // the register's generation
	removed bool   // the register says its generation is removed
}

// obsolete reports whether a cfg or backend field of generation gen is
// obsolete.
func (g portGen) obsolete(gen uint64) bool {
	return gen < g.max || (g.removed && gen <= g.reg)
}

// portGenerations returns, per port, the generations held.
func portGenerations(fields []crdt.Field) map[PortKey]portGen {
	g := map[PortKey]portGen{}
	for i := range fields {
		f := &fields[i]
		if !strings.HasPrefix(f.Key, keyPrefix) {
			continue
		}
		pk, err := parseKey(f.Key)
		if err != nil {
			continue
		}
		pg := g[pk.port]
		gen := pk.gen
		if pk.kind == 'l' {
			if !f.HasValue {
				continue
			}
			lg, removed, err := decodeListener(f.Value)
			if err != nil {
				continue
			}
			gen, pg.reg, pg.removed = lg, lg, removed
		}
		pg.max = max(pg.max, gen)
		g[pk.port] = pg
	}
	return g
}

// Obsolete is the schema's rule for crdt.Config.Obsolete: the cfg and
// backend fields of generations below the highest seen for their port, or
// of a removed generation; and, under a port floor, every listener field
// at or below it but a removed register exactly at it.
func Obsolete(_ crdt.ServiceID, fields []crdt.Field) []string {
	gens := portGenerations(fields)
	floor := floorOf(fields)
	var drop []string
	for i := range fields {
		f := &fields[i]
		if !strings.HasPrefix(f.Key, keyPrefix) || f.Key == keyFloor {
			continue
		}
		pk, err := parseKey(f.Key)
		if err != nil {
			continue
		}
		if pk.kind == 'l' {
			if floor == 0 {
				continue
			}
			gen, removed := uint64(0), false
			if f.HasValue {
				if gen, removed, err = decodeListener(f.Value); err != nil {
					continue
				}
			}
			if gen < floor || (gen == floor && !removed) {
				drop = append(drop, f.Key)
			}
			continue
		}
		if gens[pk.port].obsolete(pk.gen) || (floor > 0 && pk.gen <= floor) {
			drop = append(drop, f.Key)
		}
	}
	return drop
}

// decoded is a service read back from its merged fields.
type decoded struct {
	svc  Service
	addr netip.Addr // stored reservation, invalid if none
	// gens is what the fields say of each port's generations, so that a
	// new listener's generation is above every one held.
	gens map[PortKey]portGen
	// floor is the held port floor, 0 without one; a new listener's
	// generation is above it too.
	floor uint64
}

// decodeService turns a service's merged fields into a Service. Fields that
// break the schema make it fail with ErrSchema (the caller reports the
// service and keeps it out of routing).
func decodeService(network string, id ServiceID, fields []crdt.Field) (decoded, error) {
	d := decoded{svc: Service{ID: id, Network: network}, gens: portGenerations(fields), floor: floorOf(fields)}
	type lst struct {
		gen     uint64
		removed bool
		cfg     *Check
		idle    Duration
		backs   []Backend
		drain   []Backend
	}
	ls := map[PortKey]*lst{}
	var errs []error
	// First pass: listener registers.
	for i := range fields {
		f := &fields[i]
		switch f.Key {
		case keyName:
			if f.HasValue {
				d.svc.Name = string(f.Value)
			}
			continue
		case keyAddr:
			if f.HasValue {
				if len(f.Value) != 4 {
					errs = append(errs, fmt.Errorf("%w: addr value %x", ErrSchema, f.Value))
				} else {
					d.addr = netip.AddrFrom4([4]byte(f.Value))
				}
			}
			continue
		case keyFloor:
			if f.HasValue {
				if _, err := decodeFloor(f.Value); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		if !strings.HasPrefix(f.Key, keyPrefix) {
			errs = append(errs, fmt.Errorf("%w: unknown key %q", ErrSchema, f.Key))
			continue
		}
		pk, err := parseKey(f.Key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if pk.kind != 'l' || !f.HasValue {
			continue
		}
		gen, removed, err := decodeListener(f.Value)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ls[pk.port] = &lst{gen: gen, removed: removed}
	}
	// Second pass: cfg and backends of each listener's current generation.
	for i := range fields {
		f := &fields[i]
		if !strings.HasPrefix(f.Key, keyPrefix) {
			continue
		}
		pk, err := parseKey(f.Key)
		if err != nil || pk.kind == 'l' {
			continue
		}
		l := ls[pk.port]
		if l == nil || l.removed || l.gen != pk.gen {
			continue
		}
		switch pk.kind {
		case 'c':
			if !f.HasValue {
				continue
			}
			c, idle, err := decodeCfg(f.Value)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			l.cfg, l.idle = &c, idle
		case 'b':
			if !f.HasValue {
				continue
			}
			drain, err := decodeBackendValue(f.Value)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			l.backs = append(l.backs, pk.backend)
			if drain {
				l.drain = append(l.drain, pk.backend)
			}
		}
	}
	keys := make([]PortKey, 0, len(ls))
	for k, l := range ls {
		if !l.removed {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, comparePortKey)
	for _, k := range keys {
		l := ls[k]
		out := Listener{Proto: k.Proto, Port: k.Port, Generation: l.gen, Backends: l.backs, Drain: l.drain, IdleTimeout: l.idle}
		if l.cfg != nil {
			out.Check = *l.cfg
		}
		slices.SortFunc(out.Backends, compareBackend)
		slices.SortFunc(out.Drain, compareBackend)
		d.svc.Listeners = append(d.svc.Listeners, out)
	}
	return d, errors.Join(errs...)
}

func comparePortKey(a, b PortKey) int {
	if a.Proto != b.Proto {
		return int(a.Proto) - int(b.Proto)
	}
	return int(a.Port) - int(b.Port)
}

func compareBackend(a, b Backend) int {
	if c := slices.Compare(a.Node[:], b.Node[:]); c != 0 {
		return c
	}
	return int(a.Port) - int(b.Port)
}

// nextGeneration is the generation a new listener on port k gets: one
// above every generation held for the port and above the port floor. A
// port whose fields reached MaxGeneration (a member wrote the bound) takes
// no new listener, nor does any port once a member wrote the floor at it.
func (d *decoded) nextGeneration(k PortKey) (uint64, error) {
	if d.floor >= MaxGeneration {
		return 0, fmt.Errorf("%w: listener %s of service %s: the service's port floor is at the bound %d, written by a member; remove and recreate the service to add listeners",
			ErrLimit, k, d.svc.ID, uint64(MaxGeneration))
	}
	g := max(d.gens[k].max, d.floor)
	if g >= MaxGeneration {
		return 0, fmt.Errorf("%w: listener %s of service %s: its generation is at the bound %d, written by a member; remove and recreate the service to use the port",
			ErrLimit, k, d.svc.ID, uint64(MaxGeneration))
	}
	return g + 1, nil
}

// diffEdits returns the crdt edits that turn the held service (cur, with
// its generations) into the draft. A listener of the draft whose
// generation differs from the held one (or is 0) is a new incarnation:
// the old one is removed and the new one added with its port's next
// generation. A draft that removes listeners raises the port floor (see
// the schema above); when that cannot be done within MaxGeneration, the
// removal is written without it.
func diffEdits(cur decoded, held bool, draft Service) ([]crdt.Edit, error) {
	floor, raise := cur.floor, false
	for _, c := range cur.svc.Listeners {
		if _, ok := draft.Listener(c.Key()); !ok {
			floor, raise = max(floor, c.Generation), true
		}
	}
	if raise && floor < MaxGeneration {
		up := cur
		up.floor = floor
		if edits, err := diffEditsFloor(up, held, draft, true); !errors.Is(err, ErrLimit) {
			return edits, err
		}
	}
	return diffEditsFloor(cur, held, draft, false)
}

// diffEditsFloor is diffEdits with cur.floor the floor to write (when
// raise) or the held one.
func diffEditsFloor(cur decoded, held bool, draft Service, raise bool) ([]crdt.Edit, error) {
	var edits []crdt.Edit
	if !held || cur.svc.Name != draft.Name {
		edits = append(edits, crdt.Edit{Key: keyName, Value: []byte(draft.Name)})
	}
	curL := map[PortKey]Listener{}
	for _, l := range cur.svc.Listeners {
		curL[l.Key()] = l
	}
	draftL := map[PortKey]Listener{}
	for _, l := range draft.Listeners {
		draftL[l.Key()] = l
	}
	var keys []PortKey
	for k := range curL {
		keys = append(keys, k)
	}
	for k := range draftL {
		if _, ok := curL[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, comparePortKey)
	for _, k := range keys {
		c, inCur := curL[k]
		d, inDraft := draftL[k]
		switch {
		case inCur && !inDraft && raise:
			edits = append(edits, crdt.Edit{Key: listenerKey(k), Value: encodeListener(cur.floor, true)})
		case inCur && !inDraft:
			edits = append(edits, crdt.Edit{Key: listenerKey(k), Value: encodeListener(c.Generation, true)})
		case inDraft && (!inCur || d.Generation != c.Generation || removesBackend(c, d) || (raise && c.Generation <= cur.floor)):
			gen, err := cur.nextGeneration(k)
			if err != nil {
				return nil, err
			}
			edits = append(edits, crdt.Edit{Key: listenerKey(k), Value: encodeListener(gen, false)})
			if d.Check != (Check{}) || d.IdleTimeout != 0 {
				edits = append(edits, crdt.Edit{Key: cfgKey(k, gen), Value: encodeCfg(d.Check, d.IdleTimeout)})
			}
			for _, b := range dedupBackends(d.Backends) {
				edits = append(edits, crdt.Edit{Key: backendKey(k, gen, b), Value: encodeBackendValue(d.Draining(b))})
			}
		default: // same incarnation: settings and backends by difference
			if !sameCheck(c.Check, d.Check) || c.IdleTimeout != d.IdleTimeout {
				edits = append(edits, crdt.Edit{Key: cfgKey(k, c.Generation), Value: encodeCfg(d.Check, d.IdleTimeout)})
			}
			have := map[Backend]bool{}
			for _, b := range c.Backends {
				have[b] = true
			}
			// A held backend whose drain flag changes is rewritten.
			want := map[Backend]bool{}
			for _, b := range d.Backends {
				want[b] = true
			}
			for _, b := range dedupBackends(d.Backends) {
				if !have[b] || c.Draining(b) != d.Draining(b) {
					edits = append(edits, crdt.Edit{Key: backendKey(k, c.Generation, b), Value: encodeBackendValue(d.Draining(b))})
				}
			}
			for _, b := range c.Backends {
				if !want[b] {
					edits = append(edits, crdt.Edit{Key: backendKey(k, c.Generation, b), Clear: true})
				}
			}
		}
	}
	if raise {
		edits = append(edits, crdt.Edit{Key: keyFloor, Value: encodeFloor(cur.floor)})
	}
	return edits, nil
}

func dedupBackends(bs []Backend) []Backend {
	out := slices.Clone(bs)
	slices.SortFunc(out, compareBackend)
	return slices.Compact(out)
}

func sameCheck(a, b Check) bool {
	if (a.PortCheck == nil) != (b.PortCheck == nil) || (a.PortCheck != nil && *a.PortCheck != *b.PortCheck) {
		return false
	}
	return a.Interval == b.Interval && a.Timeout == b.Timeout && a.Failures == b.Failures && a.Successes == b.Successes
}

// removesBackend reports whether draft d drops a backend of held c.
func removesBackend(c, d Listener) bool {
	for _, b := range c.Backends {
		if !slices.Contains(d.Backends, b) {
			return true
		}
	}
	return false
}
