//go:build !unix

package flow

import (
	"testing"
	"time"
)

func cpuTime() time.Duration { return 0 }

type cpuMeter struct{}

func startCPU() cpuMeter { return cpuMeter{} }

func (cpuMeter) report(*testing.B, int, string) float64 { return 0 }
