//go:build !race

package tsng_test

// e2eRace: the test binary runs under the race detector, so the agents it
// builds do too (and share its build cache).
const e2eRace = false
