//go:build unix

package tsng

import "syscall"

func umask(m int) int { return syscall.Umask(m) }
