// Package errvocab holds no code: its tests check vipkit's error
// vocabulary across packages (docs/errors.md), which no single package can
// do without an import cycle. Every package's ErrClosed matches
// transport.ErrClosed; every bad-options sentinel is named
// ErrInvalidOptions, and each older name is the same value; options errors
// stay apart from input-validation errors.
package errvocab
