package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
)

// guardedPut writes key=val in a transaction guarded by tok and reports
// whether it committed.
func guardedPut(t *testing.T, kv claim.KV, tok claim.FenceToken, key, val string) bool {
	t.Helper()
	r, err := kv.Txn(context.Background(), claim.Txn{If: tok.Compares(), Then: []claim.Op{claim.Put(key, []byte(val), 0)}})
	if err != nil {
		t.Fatalf("guarded put: %v", err)
	}
	return r.Succeeded
}

func holderKey(t *testing.T, e *env) claim.KeyValue {
	t.Helper()
	keys := claim.KeysFor(e.f.Mesh, e.f.VIP)
	g, err := e.mkv.Get(context.Background(), keys.Holder, false)
	if err != nil || len(g.KVs) != 1 {
		t.Fatalf("holder key: %v %d", err, len(g.KVs))
	}
	return g.KVs[0]
}

// The token guards an importer's writes: they commit while this node
// holds and fail once the holder key changed hands, by a planned promote
// (which keeps the key's CreateRevision) or by a failover.
func TestFenceTokenMoves(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a, b := e.m("a"), e.m("b")
	tokA, err := a.Ctl().FenceToken()
	if err != nil || tokA.Epoch != 1 {
		t.Fatalf("holder's token: %+v %v", tokA, err)
	}
	if !guardedPut(t, e.mkv, tokA, "/app/x", "a1") {
		t.Fatal("write guarded by the holder's token failed")
	}
	if _, err := b.Ctl().FenceToken(); !errors.Is(err, claim.ErrNoToken) {
		t.Fatalf("replica's token: %v", err)
	}
	// A restarted holder confirms its holder key and has the same token.
	e.start("a")
	e.advance(3 * time.Second)
	if tok, err := a.Ctl().FenceToken(); err != nil || tok.ModRevision != tokA.ModRevision || string(tok.Value) != string(tokA.Value) {
		t.Fatalf("restarted holder's token: %+v %v, want %+v", tok, err, tokA)
	}

	// Planned promote to b: the holder key is replaced in place.
	before := holderKey(t, e)
	if _, err := b.Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	after := holderKey(t, e)
	if after.CreateRevision != before.CreateRevision {
		t.Fatalf("planned promote recreated the holder key (create revision %d → %d)", before.CreateRevision, after.CreateRevision)
	}
	// So a compare on the CreateRevision would still hold after the move...
	r, err := e.mkv.Txn(context.Background(), claim.Txn{If: []claim.Compare{{Key: before.Key, Target: claim.CreateRevision, Revision: before.CreateRevision}}})
	if err != nil || !r.Succeeded {
		t.Fatalf("create revision compare after the move: %+v %v", r, err)
	}
	// ...while the token fails.
	if guardedPut(t, e.mkv, tokA, "/app/x", "a2") {
		t.Fatal("write guarded by the old holder's token committed after a planned promote")
	}
	if _, err := a.Ctl().FenceToken(); !errors.Is(err, claim.ErrNoToken) {
		t.Fatalf("released node's token: %v", err)
	}
	tokB, err := b.Ctl().FenceToken()
	if err != nil || tokB.Epoch != 2 || !guardedPut(t, e.mkv, tokB, "/app/x", "b1") {
		t.Fatalf("new holder's token %+v %v", tokB, err)
	}

	// Failover: b is cut off, a claims after b's lease expired.
	e.advance(3 * time.Second)
	e.isolate("b", true)
	for i := 0; i < 400 && !a.Carrier.Carried(e.f.VIP); i++ {
		e.advance(100 * time.Millisecond)
	}
	if !a.Carrier.Carried(e.f.VIP) {
		t.Fatal("a never failed over")
	}
	if guardedPut(t, e.mkv, tokB, "/app/x", "b2") {
		t.Fatal("write guarded by the cut-off holder's token committed after the failover")
	}
	tokA3, err := a.Ctl().FenceToken()
	if err != nil || tokA3.Epoch != 3 || !guardedPut(t, e.mkv, tokA3, "/app/x", "a3") {
		t.Fatalf("token after the failover %+v %v", tokA3, err)
	}
	g, _ := e.mkv.Get(context.Background(), "/app/x", false)
	if string(g.KVs[0].Value) != "a3" {
		t.Fatalf("/app/x = %q", g.KVs[0].Value)
	}
}
