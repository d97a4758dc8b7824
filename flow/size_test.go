package flow

import (
	"testing"
	"unsafe"
)

func TestBindingSize(t *testing.T) {
	if s := unsafe.Sizeof(binding{}); s != 128 {
		t.Fatalf("binding is %d bytes, want 128", s)
	}
}
