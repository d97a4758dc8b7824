package vip

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Match them with errors.Is; the concrete errors carry
// details (ConflictError, AmbiguousError, ValidationError, LimitError).
var (
	// ErrInvalid means a configuration field is invalid (ValidationError names
	// every bad field).
	ErrInvalid = errors.New("vip: invalid configuration")
	// ErrLimit means a configuration or a merged state exceeds a limit
	// (LimitError names the limit and its value).
	ErrLimit = errors.New("vip: limit exceeded")
	// ErrConflict means a draft was based on a revision that is no longer
	// current; nothing was written (ConflictError carries the current one).
	ErrConflict = errors.New("vip: stale draft")
	// ErrAmbiguous means a selector matched more than one candidate; nothing
	// changed (AmbiguousError lists them).
	ErrAmbiguous = errors.New("vip: ambiguous selector")
	// ErrNotFound means a selector matched nothing.
	ErrNotFound = errors.New("vip: not found")
	// ErrExists means a create or add names something that already exists.
	ErrExists = errors.New("vip: already exists")
	// ErrNetworkDown means configuration updates need the network to be up
	// locally.
	ErrNetworkDown = errors.New("vip: network is not up locally")
	// ErrDeleted means the service was deleted (its tombstone is permanent).
	ErrDeleted = errors.New("vip: service deleted")
	// ErrInvalidOptions is returned by NewEngine for options it cannot use
	// (no Registry or Host, a Self that is not a member with an IPv4
	// overlay address, a negative duration). It is not ErrInvalid, which
	// reports a bad service configuration.
	ErrInvalidOptions = errors.New("vip: invalid options")
)

// FieldError is one invalid field of a configuration.
type FieldError struct {
	Path    string // e.g. "listeners[tcp/443].backends[1].port"
	Message string
}

func (e FieldError) String() string { return e.Path + ": " + e.Message }

// ValidationError lists every invalid field of a configuration. It matches
// ErrInvalid.
type ValidationError struct {
	Fields []FieldError
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.String()
	}
	return "vip: invalid configuration: " + strings.Join(parts, "; ")
}

// Is reports ErrInvalid.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

func (e *ValidationError) add(path, format string, args ...any) {
	e.Fields = append(e.Fields, FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
}

func (e *ValidationError) err() error {
	if e == nil || len(e.Fields) == 0 {
		return nil
	}
	return e
}

// LimitError reports a limit that a configuration or state exceeds. It
// matches ErrLimit.
type LimitError struct {
	Limit string // the Limits field, e.g. "Listeners"
	Max   int
	Have  int
	Where string // what exceeded it, e.g. a service or listener
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("vip: limit exceeded: %s has %d, over the %s limit of %d", e.Where, e.Have, e.Limit, e.Max)
}

// Is reports ErrLimit.
func (e *LimitError) Is(target error) bool { return target == ErrLimit }

// ConflictError refuses a draft based on a stale revision. It matches
// ErrConflict.
type ConflictError struct {
	Service  ServiceID
	Shown    Revision // the revision the editor was shown
	Current  Revision // the revision now
	Resource string   // the service's name, for messages
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("vip: stale draft: %s changed since it was read (draft revision %s, current %s); reload and edit again", e.Resource, e.Shown, e.Current)
}

// Is reports ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// AmbiguousError refuses a selector that matched several candidates. It
// matches ErrAmbiguous.
type AmbiguousError struct {
	Kind       string // "network", "service" or "node"
	Selector   string
	Candidates []Candidate
}

func (e *AmbiguousError) Error() string {
	parts := make([]string, len(e.Candidates))
	for i, c := range e.Candidates {
		parts[i] = c.String()
	}
	return fmt.Sprintf("vip: ambiguous selector: %s %q matches %d: %s", e.Kind, e.Selector, len(e.Candidates), strings.Join(parts, ", "))
}

// Is reports ErrAmbiguous.
func (e *AmbiguousError) Is(target error) bool { return target == ErrAmbiguous }
