//go:build !vipkit_lockorder

package syncx

import "sync"

// Mutex is sync.Mutex; with the vipkit_lockorder tag it checks lock order.
type Mutex = sync.Mutex

// RWMutex is sync.RWMutex; with the vipkit_lockorder tag it checks lock
// order.
type RWMutex = sync.RWMutex

// LockOrderChecked reports whether this build checks lock order.
const LockOrderChecked = false
