package hosting

import "errors"

// Sentinel errors of package hosting, wrapped with %w and matched with
// errors.Is.
var (
	// ErrBadUpdate: an update body cannot be decoded (bad JSON, an unknown
	// field, a bad agent id) or names an unknown method.
	ErrBadUpdate = errors.New("hosting: bad update")
	// ErrInvalid: a share or its hosts break a validation rule; the error
	// is a *ValidationError that lists the violations.
	ErrInvalid = errors.New("hosting: invalid share")
	// ErrNotFound: no share (or no live share, for a write) has the id.
	ErrNotFound = errors.New("hosting: share not found")
	// ErrExists: a create names an id that is already taken.
	ErrExists = errors.New("hosting: share exists")
	// ErrIsolation: a store transaction that locks shares does not run at
	// READ COMMITTED. At a snapshot level the host reads after the lock
	// would come from a snapshot older than the lock, so two cascades
	// could both miss each other's removal.
	ErrIsolation = errors.New("hosting: lock needs READ COMMITTED isolation")
	// ErrNoIdentity: a live agent that must get an override has no Ziti
	// identity; the update fails rather than leave it binding at required.
	ErrNoIdentity = errors.New("hosting: live agent has no Ziti identity")
	// ErrZitiState: the controller holds objects of a share that contradict
	// each other (two services or policies for one share, a missing
	// service or config type).
	ErrZitiState = errors.New("hosting: inconsistent Ziti state")
	// ErrSettings: health-check settings are missing or out of range; the
	// projection refuses to start.
	ErrSettings = errors.New("hosting: bad health-check settings")
	// ErrStore: the store failed or holds corrupt rows.
	ErrStore = errors.New("hosting: store failure")
	// ErrIngressUp: a share would be deleted while its ingress is still up
	// (a concurrent cascade made this agent its last host after the
	// teardown chose); the retry of the whole handler tears it down first.
	ErrIngressUp = errors.New("hosting: share ingress is still up")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("hosting: store closed") // +checklocksignore: read-only
)

func errorsIsBadUpdate(err error) bool { return errors.Is(err, ErrBadUpdate) }
