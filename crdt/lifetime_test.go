package crdt

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
)

// publish sends from's snapshot of id to every other replica.
func publish(t testing.TB, from *Replica, id ServiceID, rs []*Replica) {
	t.Helper()
	snap, ok := from.EncodedSnapshot(id)
	if !ok {
		t.Fatalf("publish: %s not held", id)
	}
	for _, to := range rs {
		if to == from {
			continue
		}
		if _, err := to.MergeSnapshot(context.Background(), snap); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
}

func createService(ctx context.Context, r *Replica, name string) (ServiceID, error) {
	id, _, err := r.Create(ctx, func(ServiceID) ([]Edit, error) {
		return []Edit{{Key: "name", Value: []byte(name)}}, nil
	})
	return id, err
}

// lowest returns the replica of the lowest member key.
func lowest(rs []*Replica) *Replica {
	low := rs[0]
	for _, r := range rs[1:] {
		if a, b := r.Author(), low.Author(); bytes.Compare(a[:], b[:]) < 0 {
			low = r
		}
	}
	return low
}

// compactAll runs one compaction: the lowest member proposes, every
// replica acknowledges, and every replica adds the certificate.
func compactAll(t testing.TB, rs []*Replica) {
	t.Helper()
	ctx := context.Background()
	c, ok, err := lowest(rs).Propose()
	if err != nil {
		t.Fatalf("propose: %v", err)
	}
	if !ok {
		return
	}
	cert := Certificate{Compaction: c}
	for _, r := range rs {
		a, err := r.Acknowledge(ctx, c)
		if err != nil {
			t.Fatalf("acknowledge: %v", err)
		}
		cert.Acks = append(cert.Acks, a)
	}
	slices.SortFunc(cert.Acks, func(a, b Ack) int { return bytes.Compare(a.Author[:], b.Author[:]) })
	for _, r := range rs {
		res, err := r.AddCertificate(ctx, cert)
		if err != nil || !res.Applied {
			t.Fatalf("certificate: %+v %v", res, err)
		}
	}
}

// lifetimeDeletions is how many services TestLifetimeDeletions creates and
// deletes: 100,000 under VIPKIT_LONG=1.
func lifetimeDeletions() int {
	if os.Getenv("VIPKIT_LONG") == "1" {
		return 100_000
	}
	return 5_000
}

// TestLifetimeDeletions: three members in sync create and delete services
// one after another, far past Limits.MaxTombstones deletions, and never
// hold more than MaxTombstones markers.
func TestLifetimeDeletions(t *testing.T) {
	ctx := context.Background()
	rs := []*Replica{openReplica(t, 0, 3, nil), openReplica(t, 1, 3, nil), openReplica(t, 2, 3, nil)}
	n := lifetimeDeletions()
	most := 0
	for i := 0; i < n; i++ {
		r := rs[i%3]
		id, err := createService(ctx, r, fmt.Sprintf("s%d", i))
		if err != nil {
			t.Fatalf("create #%d: %v", i+1, err)
		}
		publish(t, r, id, rs)
		if _, err := r.Delete(ctx, id, AnyRevision); err != nil {
			t.Fatalf("deletion #%d refused: %v", i+1, err)
		}
		publish(t, r, id, rs)
		if (i+1)%1000 == 0 {
			compactAll(t, rs)
		}
		for _, q := range rs {
			if h := q.OverLimit().Tombstones; h > most {
				most = h
			}
		}
		if most > DefaultMaxTombstones {
			t.Fatalf("after deletion #%d a replica holds %d markers, bound %d", i+1, most, DefaultMaxTombstones)
		}
	}
	t.Logf("%d deletions, at most %d markers held", n, most)
}
