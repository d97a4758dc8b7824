//go:build !unix

package pgtest

import (
	"context"
	"fmt"
)

// Server is a running test server; on this system none can start.
type Server struct {
	Dir  string
	Port int
}

// BinDir fails: the server needs a Unix system.
func BinDir() (string, error) { return "", fmt.Errorf("%w: needs a Unix system", ErrUnavailable) }

// Start fails with ErrUnavailable: the server needs a Unix system.
func Start(ctx context.Context) (*Server, error) {
	return nil, fmt.Errorf("%w: needs a Unix system", ErrUnavailable)
}

// ConnString returns the connection string of database db.
func (s *Server) ConnString(db string) string { return "" }

// NewDatabase fails with ErrUnavailable.
func (s *Server) NewDatabase(ctx context.Context) (string, error) { return "", ErrUnavailable }

// Stop does nothing.
func (s *Server) Stop() error { return nil }
