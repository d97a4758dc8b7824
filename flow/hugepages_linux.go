//go:build linux

package flow

import (
	"syscall"
	"unsafe"
)

// adviseHuge asks the kernel to back a large table with transparent huge
// pages (MADV_HUGEPAGE; effective when THP is in "madvise" or "always"
// mode). A million-flow table spans ~200 MB: with 4 KiB pages nearly every
// lookup also misses the TLB, which under virtualisation costs a nested page
// walk. Failure is harmless and ignored. It must run before the memory is
// first touched.
func adviseHuge(p unsafe.Pointer, size uintptr) {
	const huge = 2 << 20
	if size < 2*huge {
		return
	}
	start := (uintptr(p) + huge - 1) &^ (huge - 1)
	end := (uintptr(p) + size) &^ (huge - 1)
	if end <= start {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Add(p, start-uintptr(p))), end-start)
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE)
}
