//go:build !unix

package keelvip

import (
	"context"
	"errors"
)

// runHookCommand refuses: hooks need process groups.
func runHookCommand(context.Context, Hooks, []string) (hookResult, error) {
	return hookResult{}, errors.New("keelvip: hooks need a Unix system")
}

// processPrivileged reports true: no hook runs here.
func processPrivileged() bool { return true }
