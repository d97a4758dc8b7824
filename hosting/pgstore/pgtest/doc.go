// Package pgtest starts a throwaway PostgreSQL server for tests, from
// Debian's postgresql binaries (initdb, pg_ctl, postgres under
// /usr/lib/postgresql/*/bin): a cluster in a temporary directory, on a free
// loopback port, with its unix socket in that directory. initdb and
// postgres refuse to run as root, so under root they run as the
// unprivileged "postgres" user, which owns the directory.
//
// Tests start one server per test binary (TestMain) and take a fresh
// database per test; the sharehosts demo starts one the same way.
package pgtest

import "errors"

// ErrUnavailable means the binaries or the unprivileged user are missing, or
// the system is not a Unix.
var ErrUnavailable = errors.New("pgtest: PostgreSQL unavailable")
