package crdt

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// The defaults tests pin the three configuration limits of
// docs/defaults.md with literal values on a replica opened with zero
// Limits: each test fails if its default is any other value (one more is
// refused, one fewer fits).

func TestDefaultMaxServicesIs64(t *testing.T) {
	ctx := context.Background()
	r := openReplica(t, 0, 2, nil)
	for i := 0; i < 64; i++ {
		if _, err := r.Edit(ctx, testSvc(i), NoRevision, Edit{Key: "n"}); err != nil {
			t.Fatalf("service %d of 64: %v", i+1, err)
		}
	}
	if _, err := r.Edit(ctx, testSvc(64), NoRevision, Edit{Key: "n"}); !errors.Is(err, ErrServiceLimit) {
		t.Fatalf("65th service: %v, want ErrServiceLimit", err)
	}
	// Merged from elsewhere, the 65th is held, reported and not routed.
	if _, err := r.MergeSnapshot(ctx, snapOf(mkField(1, testSvc(64), "n", "", 1, 1))); err != nil {
		t.Fatalf("merged 65th service: %v", err)
	}
	if err := r.ServiceError(testSvc(64)); !errors.Is(err, ErrServiceLimit) {
		t.Fatalf("merged 65th service state: %v, want ErrServiceLimit", err)
	}
	if o := r.OverLimit(); len(o.Services) != 1 || o.Services[0] != testSvc(64) {
		t.Fatalf("over limit: %+v", o)
	}
}

func TestDefaultMaxTombstonesIs1024(t *testing.T) {
	ctx := context.Background()
	r := openReplica(t, 0, 2, nil)
	for i := 0; i < 1024; i++ {
		if _, err := r.Edit(ctx, testSvc(i), NoRevision, Edit{Key: "n"}); err != nil {
			t.Fatalf("service %d: %v", i, err)
		}
		if _, err := r.Delete(ctx, testSvc(i), AnyRevision); err != nil {
			t.Fatalf("tombstone %d of 1024: %v", i+1, err)
		}
	}
	if _, err := r.Edit(ctx, testSvc(1024), NoRevision, Edit{Key: "n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Delete(ctx, testSvc(1024), AnyRevision); !errors.Is(err, ErrTombstoneLimit) {
		t.Fatalf("1025th tombstone: %v, want ErrTombstoneLimit", err)
	}
	if o := r.OverLimit(); !errors.Is(o.Err, ErrTombstoneLimit) || o.Tombstones != 1024 {
		t.Fatalf("full history not reported: %+v", o)
	}
}

func TestDefaultMaxFieldsPerServiceIs192(t *testing.T) {
	ctx := context.Background()
	r := openReplica(t, 0, 2, nil)
	svc := testSvc(0)
	edits := make([]Edit, 192)
	for i := range edits {
		edits[i] = Edit{Key: fmt.Sprintf("k%03d", i)}
	}
	if _, err := r.Edit(ctx, svc, NoRevision, edits...); err != nil {
		t.Fatalf("192 fields: %v", err)
	}
	if _, err := r.Edit(ctx, svc, AnyRevision, Edit{Key: "k192"}); !errors.Is(err, ErrFieldLimit) {
		t.Fatalf("193rd field: %v, want ErrFieldLimit", err)
	}
	if n := len(r.Fields(svc)); n != 192 {
		t.Fatalf("refused edit changed the service: %d fields", n)
	}
	if lim := r.Limits(); lim.MaxServices != 64 || lim.MaxTombstones != 1024 || lim.MaxFieldsPerService != 192 {
		t.Fatalf("Limits() = %+v", lim)
	}
}
