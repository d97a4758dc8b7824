package flow

import (
	"testing"
	"unsafe"
)

// The table's layout is what keeps a million flows within 256 bytes each
// and an established packet to one cache miss: a binding is one cache
// line, an index entry half of one (so entries never straddle lines).
func TestBindingSize(t *testing.T) {
	if s := unsafe.Sizeof(binding{}); s != 64 {
		t.Fatalf("binding is %d bytes, want 64", s)
	}
	if s := unsafe.Sizeof(indexEntry{}); s != 32 {
		t.Fatalf("index entry is %d bytes, want 32", s)
	}
	if s := unsafe.Sizeof(bindingCold{}); s > 40 {
		t.Fatalf("cold binding part is %d bytes, want at most 40", s)
	}
	// Per flow: two index entries at a load factor of at most ½, the
	// binding and its cold part.
	if s := 4*unsafe.Sizeof(indexEntry{}) + unsafe.Sizeof(binding{}) + unsafe.Sizeof(bindingCold{}); s > 240 {
		t.Fatalf("%d bytes of table per flow, want at most 240 (256 with the rest)", s)
	}
}
