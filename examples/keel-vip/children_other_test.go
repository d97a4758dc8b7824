//go:build !linux

package keelvip_test

func registerChildren() {}

func captureChildInput() {}
