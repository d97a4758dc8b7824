package crdt

import (
	"context"
	"testing"
)

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	a := openReplica(t, 0, 2, nil)
	b := openReplica(t, 1, 2, nil)
	svc := testSvc(1)
	fs, err := a.Edit(ctx, svc, NoRevision, Edit{Key: "name", Value: []byte("api")}, Edit{Key: "port", Value: []byte("443")})
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 2 || fs[0].Counter != 1 || fs[1].Counter != 2 || fs[0].Lamport != 1 {
		t.Fatalf("fields %v", fs)
	}
	snap, _ := a.EncodedSnapshot(svc)
	res, err := b.MergeSnapshot(ctx, snap)
	if err != nil || res.Accepted != 2 {
		t.Fatalf("merge %+v %v", res, err)
	}
	res, err = b.MergeSnapshot(ctx, snap)
	if err != nil || res.Identical != 2 || len(res.Changed) != 0 {
		t.Fatalf("remerge %+v %v", res, err)
	}
	info, _ := b.Service(svc)
	if _, err := b.Edit(ctx, svc, info.Revision, Edit{Key: "name", Value: []byte("api2")}); err != nil {
		t.Fatal(err)
	}
	snap2, _ := b.EncodedSnapshot(svc)
	if _, err := a.MergeSnapshot(ctx, snap2); err != nil {
		t.Fatal(err)
	}
	if got := string(a.Fields(svc)[0].Value); got != "api2" {
		t.Fatalf("name %q", got)
	}
}
