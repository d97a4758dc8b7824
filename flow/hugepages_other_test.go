//go:build !linux

package flow

import "unsafe"

func hugeShare(unsafe.Pointer, uintptr) float64 { return -1 }
