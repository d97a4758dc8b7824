//go:build linux

package flow

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"
)

// hugeShare returns the share (0..1) of the memory [p, p+size) that the
// kernel backs with transparent huge pages, from /proc/self/smaps (the
// AnonHugePages of each mapping, prorated to the overlap), or -1 when it
// cannot tell.
func hugeShare(p unsafe.Pointer, size uintptr) float64 {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return -1
	}
	defer f.Close()
	lo, hi := uintptr(p), uintptr(p)+size
	var huge, seen float64
	var a, b uintptr
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 {
			continue
		}
		if strings.Contains(fs[0], "-") && !strings.HasSuffix(fs[0], ":") {
			if _, err := fmt.Sscanf(fs[0], "%x-%x", &a, &b); err == nil {
				in = a < hi && lo < b
				continue
			}
		}
		if in && fs[0] == "AnonHugePages:" && len(fs) > 1 {
			kb, _ := strconv.ParseFloat(fs[1], 64)
			overlap := float64(min(b, hi) - max(a, lo))
			huge += kb * 1024 * overlap / float64(b-a)
			seen += overlap
		}
	}
	if seen == 0 {
		return -1
	}
	return huge / float64(size)
}
