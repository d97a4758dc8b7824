package pebblestore_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/crdt/pebblestore"
)

// A replica on a pebble store keeps its services and its author counter
// across a restart.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "crdt-example")
	defer os.RemoveAll(dir)
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32))
	net := crdt.NetworkID{1}
	svc := crdt.ServiceID{2}

	st, err := pebblestore.Open(ctx, filepath.Join(dir, "vip"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	r, _ := crdt.Open(ctx, crdt.Config{Network: net, Signer: key, Store: st})
	first, _ := r.Edit(ctx, svc, crdt.NoRevision, crdt.Edit{Key: "name", Value: []byte("api")})
	_ = r.Close() // closes st

	st, _ = pebblestore.Open(ctx, filepath.Join(dir, "vip"), nil)
	r, _ = crdt.Open(ctx, crdt.Config{Network: net, Signer: key, Store: st})
	defer r.Close()
	fs, _ := r.Edit(ctx, svc, crdt.AnyRevision, crdt.Edit{Key: "port", Value: []byte("443")})
	fmt.Println("fields:", len(r.Fields(svc)), "counter grew:", fs[0].Counter > first[0].Counter)
	// Output:
	// fields: 2 counter grew: true
}
