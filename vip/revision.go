package vip

// Revision identifies one state of a service's configuration. It is a digest
// of the service's merged signed fields, so two replicas holding the same
// fields show the same revision, and any merged change gives a new one.
// Editors read a revision with the service and hand it back on save.
type Revision string

func (r Revision) String() string {
	if r == "" {
		return "none"
	}
	return string(r)
}
