//go:build !linux

package flow

import "unsafe"

func adviseHuge(unsafe.Pointer, uintptr) {}
