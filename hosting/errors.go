package hosting

import (
	"errors"
	"fmt"

	"github.com/vipkit/vipkit/transport"
)

// Sentinel errors of package hosting, wrapped with %w and matched with
// errors.Is.
var (
	// ErrBadUpdate means an update body cannot be decoded (bad JSON, an unknown
	// field, a bad agent id) or names an unknown method.
	ErrBadUpdate = errors.New("hosting: bad update")
	// ErrInvalid means a share or its hosts break a validation rule; the error
	// is a *ValidationError that lists the violations.
	ErrInvalid = errors.New("hosting: invalid share")
	// ErrNotFound means no share (or no live share, for a write) has the id.
	ErrNotFound = errors.New("hosting: share not found")
	// ErrExists means a create names an id that is already taken.
	ErrExists = errors.New("hosting: share exists")
	// ErrIsolation means a store transaction that locks shares does not run at
	// READ COMMITTED. At a snapshot level the host reads after the lock
	// would come from a snapshot older than the lock, so two cascades
	// could both miss each other's removal.
	ErrIsolation = errors.New("hosting: lock needs READ COMMITTED isolation")
	// ErrNoIdentity means a live agent that must get an override has no Ziti
	// identity; the update fails rather than leave it binding at required.
	ErrNoIdentity = errors.New("hosting: live agent has no Ziti identity")
	// ErrZitiState means the controller holds objects of a share that
	// contradict each other (two services or policies for one share, a
	// missing service or config type).
	ErrZitiState = errors.New("hosting: inconsistent Ziti state")
	// ErrSettings means health-check settings are missing or out of range; the
	// projection refuses to start.
	ErrSettings = errors.New("hosting: bad health-check settings")
	// ErrStore means the store failed or holds corrupt rows.
	ErrStore = errors.New("hosting: store failure")
	// ErrIngressUp means a share would be deleted while its ingress is still up
	// (a concurrent cascade made this agent its last host after the
	// teardown chose); the retry of the whole handler tears it down first.
	ErrIngressUp = errors.New("hosting: share ingress is still up")
	// ErrClosed means the store was closed. It matches transport.ErrClosed (and
	// so net.ErrClosed).
	ErrClosed = fmt.Errorf("hosting: store closed: %w", transport.ErrClosed) // +checklocksignore: read-only
	// ErrInvalidOptions is returned by NewProjection and NewService for
	// options they cannot use (no Ziti client, no frontdoor id, no store
	// or projection). It also matches ErrSettings, the error of bad
	// health-check settings, which NewProjection reports for its options'
	// HealthCheck.
	ErrInvalidOptions error = &alsoError{msg: "hosting: invalid options", also: ErrSettings}
)

// alsoError is a sentinel with its own message that also matches another
// sentinel.
type alsoError struct {
	msg  string
	also error
}

func (e *alsoError) Error() string { return e.msg }
func (e *alsoError) Unwrap() error { return e.also }

func errorsIsBadUpdate(err error) bool { return errors.Is(err, ErrBadUpdate) }
