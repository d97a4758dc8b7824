package crdt_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"

	"github.com/vipkit/vipkit/crdt"
)

func exampleKey(b byte) (ed25519.PrivateKey, crdt.AuthorID) {
	k := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, 32))
	return k, crdt.AuthorID(k.Public().(ed25519.PublicKey))
}

// Two members edit a service on their own replicas and exchange snapshots;
// both end with the same fields.
func Example() {
	ctx := context.Background()
	net := crdt.NetworkID{1}
	keyA, idA := exampleKey(1)
	keyB, idB := exampleKey(2)
	members := []crdt.AuthorID{idA, idB}

	a, _ := crdt.Open(ctx, crdt.Config{Network: net, Signer: keyA, Members: members})
	defer a.Close()
	b, _ := crdt.Open(ctx, crdt.Config{Network: net, Signer: keyB, Members: members})
	defer b.Close()

	svc := crdt.ServiceID{0xab}
	if _, err := a.Edit(ctx, svc, crdt.NoRevision,
		crdt.Edit{Key: "name", Value: []byte("api")},
		crdt.Edit{Key: "listener/tcp/443", Value: []byte("server1:6443")}); err != nil {
		fmt.Println(err)
		return
	}
	snap, _ := a.EncodedSnapshot(svc)
	res, err := b.MergeSnapshot(ctx, snap)
	fmt.Println("b accepted", res.Accepted, err)

	// b edits one field, a merges b's snapshot back.
	info, _ := b.Service(svc)
	_, _ = b.Edit(ctx, svc, info.Revision, crdt.Edit{Key: "listener/tcp/443", Value: []byte("server2:7443")})
	snap, _ = b.EncodedSnapshot(svc)
	res, _ = a.MergeSnapshot(ctx, snap)
	fmt.Println("a accepted", res.Accepted, "identical", res.Identical)
	for _, f := range a.Fields(svc) {
		fmt.Printf("%s = %s (lamport %d)\n", f.Key, f.Value, f.Lamport)
	}
	ra, _ := a.Service(svc)
	rb, _ := b.Service(svc)
	fmt.Println("same revision:", ra.Revision == rb.Revision)
	// Output:
	// b accepted 2 <nil>
	// a accepted 1 identical 1
	// listener/tcp/443 = server2:7443 (lamport 2)
	// name = api (lamport 1)
	// same revision: true
}

// Deleting a service leaves a signed tombstone that wins over every field
// of the service, including replays of older snapshots.
func ExampleReplica_Delete() {
	ctx := context.Background()
	key, id := exampleKey(1)
	r, _ := crdt.Open(ctx, crdt.Config{Network: crdt.NetworkID{1}, Signer: key, Members: []crdt.AuthorID{id}})
	defer r.Close()
	svc := crdt.ServiceID{0xcd}
	_, _ = r.Edit(ctx, svc, crdt.NoRevision, crdt.Edit{Key: "name", Value: []byte("db")})
	old, _ := r.EncodedSnapshot(svc)

	tomb, _ := r.Delete(ctx, svc, crdt.AnyRevision)
	fmt.Println("tombstone:", tomb.IsTombstone())
	res, _ := r.MergeSnapshot(ctx, old)
	info, _ := r.Service(svc)
	fmt.Println("replay ignored:", res.Ignored, "deleted:", info.Deleted, "fields:", info.Fields)
	_, err := r.Edit(ctx, svc, crdt.AnyRevision, crdt.Edit{Key: "name", Value: []byte("db")})
	fmt.Println(err)
	// Output:
	// tombstone: true
	// replay ignored: 1 deleted: true fields: 0
	// crdt: service deleted: cd000000000000000000000000000000
}

// A field's wire encoding and its verification.
func ExampleSign() {
	key, _ := exampleKey(7)
	f := crdt.Field{Network: crdt.NetworkID{1}, Service: crdt.ServiceID{2}, Key: "name",
		HasValue: true, Value: []byte("api"), Lamport: 300, Counter: 128}
	crdt.Sign(key, &f)
	enc := f.Encode()
	dec, err := crdt.DecodeField(enc)
	fmt.Println(len(enc), err, crdt.VerifySignature(&dec))
	dec.Value[0] = 'A' // any change breaks the signature
	fmt.Println(crdt.VerifySignature(&dec))
	// Output:
	// 143 <nil> <nil>
	// crdt: bad signature
}

// A member publishes more services than the limit. The replica holds them
// all, routes the first by id, and reports the rest naming the author,
// the same on every replica whatever the arrival order.
func ExampleReplica_OverLimit() {
	ctx := context.Background()
	key, id := exampleKey(1)
	other, otherID := exampleKey(2)
	r, _ := crdt.Open(ctx, crdt.Config{Network: crdt.NetworkID{1}, Signer: key,
		Members: []crdt.AuthorID{id, otherID}, Limits: crdt.Limits{MaxServices: 1}})
	defer r.Close()
	for _, svc := range []crdt.ServiceID{{0x20}, {0x10}} { // the higher id first
		f := crdt.Field{Network: crdt.NetworkID{1}, Service: svc, Key: "name", HasValue: true, Value: []byte("x"), Lamport: 1, Counter: uint64(svc[0])}
		crdt.Sign(other, &f)
		_, _ = r.MergeFields(ctx, []crdt.Field{f})
	}
	for _, s := range r.Services() {
		fmt.Printf("%x routed=%v\n", s.ID[0], s.Err == nil)
	}
	o := r.OverLimit()
	fmt.Println(len(o.Services), "over the limit;", o.Authors[otherID], "fields by the other member")
	// Output:
	// 10 routed=true
	// 20 routed=false
	// 1 over the limit; 1 fields by the other member
}
