package vip

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/crdt/pebblestore"
)

// testdata/compat-v2 was written by the change that brought creator-bound
// ids and compaction certificates (#37): a pebble store with a
// certificate (meta record version 3), the snapshots of its services,
// creation fields included, and the certificate. `go test ./vip -run
// TestCompatV2Generate -args -compat2.generate` rewrites it.
var compat2Generate = flag.Bool("compat2.generate", false, "rewrite testdata/compat-v2")

const compat2Dir = "testdata/compat-v2"

func compat2Replica(t testing.TB, i int, st crdt.Store) *crdt.Replica {
	t.Helper()
	r, err := crdt.Open(context.Background(), crdt.Config{Network: compatNet, Signer: compatKey(i), Members: compatMembers(), Store: st, Obsolete: Obsolete, Check: CheckField, Rank: Rank})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCompatV2Generate(t *testing.T) {
	if !*compat2Generate {
		t.Skip("run with -compat2.generate to rewrite the fixtures")
	}
	ctx := context.Background()
	if err := os.RemoveAll(compat2Dir); err != nil {
		t.Fatal(err)
	}
	st, err := pebblestore.Open(ctx, filepath.Join(compat2Dir, "pebble"), nil)
	if err != nil {
		t.Fatal(err)
	}
	repA, repB := compat2Replica(t, 0, st), compat2Replica(t, 1, nil)
	defer repB.Close()
	a, b := compatRegistry(t, repA, 1), compatRegistry(t, repB, 2)
	n0, n1 := compatNodes()[0].ID, compatNodes()[1].ID
	must := func(_ ServiceView, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(a.Create(ctx, "api"))
	must(a.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{{n0, 8443}, {n1, 8443}}))
	must(b.Create(ctx, "db"))
	must(b.PortAdd(ctx, "db", PortKey{TCP, 5432}, []Backend{{n1, 5432}}))
	for _, name := range []string{"gone1", "gone2"} {
		must(a.Create(ctx, name))
		if err := a.Remove(ctx, name, ""); err != nil {
			t.Fatal(err)
		}
	}
	sync := func(from, to *crdt.Replica) {
		for _, in := range from.Services() {
			snap, _ := from.EncodedSnapshot(in.ID)
			if _, err := to.MergeSnapshot(ctx, snap); err != nil {
				t.Fatal(err)
			}
		}
	}
	sync(repA, repB)
	sync(repB, repA)
	var snaps bytes.Buffer
	for _, in := range repA.Services() {
		snap, _ := repA.EncodedSnapshot(in.ID)
		fmt.Fprintf(&snaps, "%x\n", snap)
	}
	c, ok, err := repA.Propose()
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	cert := crdt.Certificate{Compaction: c}
	for _, r := range []*crdt.Replica{repA, repB} {
		ack, err := r.Acknowledge(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		cert.Acks = append(cert.Acks, ack)
	}
	if bytes.Compare(cert.Acks[0].Author[:], cert.Acks[1].Author[:]) > 0 {
		cert.Acks[0], cert.Acks[1] = cert.Acks[1], cert.Acks[0]
	}
	if res, err := repA.AddCertificate(ctx, cert); err != nil || !res.Applied {
		t.Fatal(res, err)
	}
	a.Refresh()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(compat2Dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("snapshots.txt", snaps.String()) // before the compaction: the deleted ones' markers too
	write("certificate.txt", fmt.Sprintf("%x\n", cert.Encode()))
	write("registry.txt", compatView(a))
	if err := repA.Close(); err != nil {
		t.Fatal(err)
	}
}

func readCompat2(t testing.TB, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(compat2Dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// TestCompatV2 loads what this change wrote: the store with its
// certificate opens with the same state, the snapshots' deleted services
// are refused as compacted, the live ones decode to the same services,
// and the certificate applies on a fresh replica.
func TestCompatV2(t *testing.T) {
	if *compat2Generate {
		t.Skip("generating")
	}
	ctx := context.Background()
	want := strings.Join(readCompat2(t, "registry.txt"), "\n") + "\n"
	var snaps [][]byte
	for _, l := range readCompat2(t, "snapshots.txt") {
		b, err := hex.DecodeString(l)
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, b)
	}
	certRaw, err := hex.DecodeString(readCompat2(t, "certificate.txt")[0])
	if err != nil {
		t.Fatal(err)
	}
	cert, err := crdt.DecodeCertificate(certRaw)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "pebble")
	copyDir(t, filepath.Join(compat2Dir, "pebble"), dir)
	st, err := pebblestore.Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	repA := compat2Replica(t, 0, st)
	defer repA.Close()
	if got := compatView(compatRegistry(t, repA, 1)); got != want {
		t.Fatalf("store decodes differently:\n got %s\nwant %s", got, want)
	}
	if held, ok := repA.Certificate(); !ok || !bytes.Equal(held.Encode(), certRaw) {
		t.Fatal("the stored certificate differs")
	}
	for _, in := range repA.Services() {
		if in.Deleted {
			t.Fatalf("marker %s held after the compaction", in.ID)
		}
	}
	res, _ := repA.MergeSnapshots(ctx, snaps)
	if res.Refused.Deleted == 0 || len(res.Changed) != 0 {
		t.Fatalf("replayed snapshots: %+v", res)
	}
	// A fresh replica takes the certificate, then the snapshots.
	repC := compat2Replica(t, 1, nil)
	defer repC.Close()
	if r, err := repC.AddCertificate(ctx, cert); err != nil || !r.Applied {
		t.Fatal(r, err)
	}
	repC.MergeSnapshots(ctx, snaps)
	if got := compatView(compatRegistry(t, repC, 3)); got != want {
		t.Fatalf("snapshots decode differently:\n got %s\nwant %s", got, want)
	}
}

// TestCompatMixedMesh shows what an agent without creation fields and
// certificates (today's before #37) does with what this change writes,
// using the checks it runs: its CheckField, unchanged here, refuses the
// creation field alone (ErrSchema), so it holds and routes the service
// without it and sends it on so; a current agent merges that copy and
// keeps its own creation field, so both route the same service. Its
// HandleFrame refuses certificate frames as an unknown type (ErrFrame,
// counted) and never acknowledges, so compaction stalls, naming it,
// until every member runs this change.
func TestCompatMixedMesh(t *testing.T) {
	ctx := context.Background()
	var snaps [][]byte
	for _, l := range readCompat2(t, "snapshots.txt") {
		b, _ := hex.DecodeString(l)
		snaps = append(snaps, b)
	}
	cur := compat2Replica(t, 0, nil)
	defer cur.Close()
	old := compat2Replica(t, 1, nil) // holds what the older agent holds
	defer old.Close()
	var stripped [][]byte
	for _, b := range snaps {
		s, err := crdt.DecodeSnapshot(b, nil)
		if err != nil {
			t.Fatal(err)
		}
		var keep []crdt.Field
		for _, f := range s.Fields {
			if f.IsCreation() {
				if err := CheckField(&f); !errors.Is(err, ErrSchema) {
					t.Fatalf("CheckField(creation field) = %v, want ErrSchema (the older agent's refusal)", err)
				}
				continue
			}
			keep = append(keep, f)
		}
		s.Fields = keep
		stripped = append(stripped, s.Encode())
	}
	if _, err := old.MergeSnapshots(ctx, stripped); err != nil {
		t.Fatal(err)
	}
	if _, err := cur.MergeSnapshots(ctx, snaps); err != nil {
		t.Fatal(err)
	}
	// The older agent's copies come back to the current one: nothing
	// changes there, and both route the same services.
	res, err := cur.MergeSnapshots(ctx, stripped)
	if err != nil || len(res.Changed) != 0 {
		t.Fatalf("stripped copies changed the current agent: %+v %v", res, err)
	}
	if a, b := compatView(compatRegistry(t, cur, 1)), compatView(compatRegistry(t, old, 2)); a != b {
		t.Fatalf("the agents route differently:\n%s\n%s", a, b)
	}
	// With the older agent's copy, the current agent's acknowledgement
	// would differ from its: the older agent lists the services as having
	// no creation field (legacy), so no certificate is made.
	c, ok, err := cur.Propose()
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := old.Acknowledge(ctx, c); !errors.Is(err, crdt.ErrCompaction) {
		t.Fatalf("a replica holding the stripped copies acknowledged: %v", err)
	}
}
