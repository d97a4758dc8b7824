//go:build !unix

package rmqtest

import (
	"context"
	"fmt"
)

// Server is a running broker; on this system none can start.
type Server struct {
	Dir              string
	Port, Dist, EPMD int
}

// Start fails with ErrUnavailable: the broker needs a Unix system.
func Start(ctx context.Context) (*Server, error) {
	return nil, fmt.Errorf("%w: needs a Unix system", ErrUnavailable)
}

// URL returns the broker's AMQP URL.
func (s *Server) URL() string { return "" }

// Log returns what the broker wrote.
func (s *Server) Log() string { return "" }

// Restart fails with ErrUnavailable.
func (s *Server) Restart(ctx context.Context) error { return ErrUnavailable }

// StopBroker fails with ErrUnavailable.
func (s *Server) StopBroker() error { return ErrUnavailable }

// StartBroker fails with ErrUnavailable.
func (s *Server) StartBroker(ctx context.Context) error { return ErrUnavailable }

// Stop does nothing.
func (s *Server) Stop() error { return nil }
