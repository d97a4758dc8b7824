package vip

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/crdt/pebblestore"
)

// The compatibility fixtures in testdata/compat-v1 were written by the code
// before the hostile-member and damaged-disk changes (the wire format and
// store format 1). TestCompatV1 checks that they still load and merge;
// `go test ./vip -run TestCompatGenerate -compat.generate` rewrites them
// and is only meant to be run on that older code.
var compatGenerate = flag.Bool("compat.generate", false, "rewrite testdata/compat-v1 (only on the code that defines format 1)")

const compatDir = "testdata/compat-v1"

var compatNet = crdt.NetworkID{'c', 'o', 'm', 'p', 'a', 't'}

func compatKey(i int) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{byte(0xc0 + i)}, 32))
}

func compatNodes() []NodeInfo {
	var out []NodeInfo
	for i := range 2 {
		var id NodeID
		copy(id[:], compatKey(i).Public().(ed25519.PublicKey))
		out = append(out, NodeInfo{ID: id, Name: fmt.Sprintf("node%d", i), Addr: netip.AddrFrom4([4]byte{100, 90, 0, byte(i + 1)})})
	}
	return out
}

func compatMembers() []crdt.AuthorID {
	var out []crdt.AuthorID
	for _, n := range compatNodes() {
		out = append(out, crdt.AuthorID(n.ID))
	}
	return out
}

func compatRegistry(t testing.TB, rep *crdt.Replica, seed byte) *Registry {
	t.Helper()
	reg, err := NewRegistry(RegistryOptions{Network: "home", Prefix: netip.MustParsePrefix("100.90.0.0/16"), Replica: rep,
		Nodes: compatNodes, Rand: rand.NewChaCha8([32]byte{seed, 'c'})})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// compatView renders a registry's services for comparison.
func compatView(reg *Registry) string {
	var b strings.Builder
	for _, v := range reg.List() {
		j, _ := json.Marshal(v.Service)
		fmt.Fprintf(&b, "%s %s routable=%v err=%q %s\n", v.ID, v.Addr, v.Routable, v.Err, j)
	}
	return b.String()
}

func TestCompatGenerate(t *testing.T) {
	if !*compatGenerate {
		t.Skip("run with -compat.generate to rewrite the fixtures")
	}
	ctx := context.Background()
	if err := os.RemoveAll(compatDir); err != nil {
		t.Fatal(err)
	}
	st, err := pebblestore.Open(ctx, filepath.Join(compatDir, "pebble"), nil)
	if err != nil {
		t.Fatal(err)
	}
	repA, err := crdt.Open(ctx, crdt.Config{Network: compatNet, Signer: compatKey(0), Members: compatMembers(), Store: st, Obsolete: Obsolete, Check: CheckField, Rank: Rank})
	if err != nil {
		t.Fatal(err)
	}
	repB, err := crdt.Open(ctx, crdt.Config{Network: compatNet, Signer: compatKey(1), Members: compatMembers(), Obsolete: Obsolete, Check: CheckField, Rank: Rank})
	if err != nil {
		t.Fatal(err)
	}
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
	must(a.PortAdd(ctx, "api", PortKey{UDP, 53}, []Backend{{n1, 5353}}))
	on, iv := true, Duration(2e9)
	must(a.PortSet(ctx, "api", PortKey{TCP, 443}, PortSettings{PortCheck: &on, Interval: &iv}))
	must(a.Create(ctx, "web"))
	must(a.PortAdd(ctx, "web", PortKey{TCP, 80}, []Backend{{n0, 8080}}))
	must(a.PortRemove(ctx, "web", PortKey{TCP, 80}))
	must(a.PortAdd(ctx, "web", PortKey{TCP, 80}, []Backend{{n1, 8081}}))
	must(a.Create(ctx, "gone"))
	if err := a.Remove(ctx, "gone", ""); err != nil {
		t.Fatal(err)
	}
	must(b.Create(ctx, "db"))
	must(b.PortAdd(ctx, "db", PortKey{TCP, 5432}, []Backend{{n1, 5432}}))
	for _, in := range repB.Services() {
		snap, _ := repB.EncodedSnapshot(in.ID)
		if _, err := repA.MergeSnapshot(ctx, snap); err != nil {
			t.Fatal(err)
		}
	}
	a.Refresh()
	var snaps bytes.Buffer
	for _, in := range repA.Services() {
		snap, _ := repA.EncodedSnapshot(in.ID)
		fmt.Fprintf(&snaps, "%x\n", snap)
	}
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(compatDir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("snapshots.txt", snaps.String())
	write("registry.txt", compatView(a))
	write("replica.txt", fmt.Sprintf("lamport %d\ncounter %d\n", repA.Lamport(), repA.Counter(repA.Author())))
	if err := repA.Close(); err != nil {
		t.Fatal(err)
	}
	// The MemStore records of the same state, as crdt frames them.
	mem := crdt.NewMemStore()
	st2, err := pebblestore.Open(ctx, filepath.Join(compatDir, "pebble"), nil)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st2.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = st2.Close()
	var rb strings.Builder
	fmt.Fprintf(&rb, "meta %x\n", recs.Meta)
	for _, r := range recs.Services {
		fmt.Fprintf(&rb, "%s %x\n", r.Service, r.Data)
	}
	write("records.txt", rb.String())
	_ = mem.Close()
}

func readLines(t testing.TB, name string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(compatDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// copyDir copies a fixture directory so that opening it cannot change the
// committed files.
func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCompatV1 loads and merges what the format-1 code wrote: its pebble
// store opens with the same state, its snapshots merge into a fresh
// replica and decode to the same services, and both replicas still edit.
func TestCompatV1(t *testing.T) {
	if *compatGenerate {
		t.Skip("generating")
	}
	ctx := context.Background()
	want := strings.Join(readLines(t, "registry.txt"), "\n") + "\n"
	var snaps [][]byte
	for _, l := range readLines(t, "snapshots.txt") {
		b, err := hex.DecodeString(l)
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, b)
	}
	// The store written by format-1 code.
	dir := filepath.Join(t.TempDir(), "pebble")
	copyDir(t, filepath.Join(compatDir, "pebble"), dir)
	st, err := pebblestore.Open(ctx, dir, nil)
	if err != nil {
		t.Fatalf("open a format-1 store: %v", err)
	}
	repA, err := crdt.Open(ctx, crdt.Config{Network: compatNet, Signer: compatKey(0), Members: compatMembers(), Store: st, Obsolete: Obsolete, Check: CheckField, Rank: Rank})
	if err != nil {
		t.Fatalf("open a format-1 replica: %v", err)
	}
	defer repA.Close()
	a := compatRegistry(t, repA, 1)
	if got := compatView(a); got != want {
		t.Fatalf("format-1 store decodes differently:\n got %s\nwant %s", got, want)
	}
	for i, in := range repA.Services() {
		snap, _ := repA.EncodedSnapshot(in.ID)
		if !bytes.Equal(snap, snaps[i]) {
			t.Fatalf("service %s: held snapshot differs from the format-1 one", in.ID)
		}
	}
	// The snapshots merge into a fresh replica of this build.
	repC, err := crdt.Open(ctx, crdt.Config{Network: compatNet, Signer: compatKey(1), Members: compatMembers(), Obsolete: Obsolete, Check: CheckField, Rank: Rank})
	if err != nil {
		t.Fatal(err)
	}
	defer repC.Close()
	res, err := repC.MergeSnapshots(ctx, snaps)
	if err != nil || res.Rejected != 0 {
		t.Fatalf("merge format-1 snapshots: %+v %v", res, err)
	}
	c := compatRegistry(t, repC, 3)
	if got := compatView(c); got != want {
		t.Fatalf("format-1 snapshots decode differently:\n got %s\nwant %s", got, want)
	}
	// Both still edit, and the edits merge both ways.
	n1 := compatNodes()[1].ID
	if _, err := a.BackendAdd(ctx, "api", PortKey{TCP, 443}, Backend{n1, 9443}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PortAdd(ctx, "db", PortKey{UDP, 5432}, []Backend{{n1, 5432}}); err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]*crdt.Replica{{repA, repC}, {repC, repA}} {
		for _, in := range pair[0].Services() {
			snap, _ := pair[0].EncodedSnapshot(in.ID)
			if _, err := pair[1].MergeSnapshot(ctx, snap); err != nil {
				t.Fatal(err)
			}
		}
	}
	a.Refresh()
	c.Refresh()
	if ga, gc := compatView(a), compatView(c); ga != gc {
		t.Fatalf("replicas differ after edits:\n%s\n%s", ga, gc)
	}
}
