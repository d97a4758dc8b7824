// Package syncx holds the mutex types every vipkit package uses in place of
// sync.Mutex and sync.RWMutex.
//
// In a normal build they are aliases of the sync types: no cost, no change.
// Built with the tag vipkit_lockorder (`go test -tags vipkit_lockorder`) they
// are go-deadlock's mutexes, which record the order in which each goroutine
// takes locks and stop the test binary with both stacks the first time two
// locks are taken in opposite orders: an ABBA deadlock is reported on the
// first run that exercises both orders, not only on the run that hangs.
// CI runs the unit packages with the tag (docs/locking.md).
package syncx
