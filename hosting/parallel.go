package hosting

import (
	"errors"
	"sync"
)

// concurrently runs fns at once, each in a goroutine of its own, and
// returns when all have returned, with their errors joined in the order of
// fns. The projection makes its independent Ziti lookups through it, so
// that an operation waits for one round trip to the controller instead of
// one per lookup. fns must not share unguarded state; each writes only its
// own results.
func concurrently(fns ...func() error) error {
	switch len(fns) {
	case 0:
		return nil
	case 1:
		return fns[0]()
	}
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i+1] = fn()
		}()
	}
	errs[0] = fns[0]()
	wg.Wait()
	return errors.Join(errs...)
}
