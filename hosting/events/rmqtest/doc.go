// Package rmqtest starts a throwaway RabbitMQ broker for tests, from
// Debian's rabbitmq-server (/usr/lib/rabbitmq/bin/rabbitmq-server): a node
// of its own name, on free loopback ports (AMQP, distribution and epmd,
// ERL_EPMD_PORT), with its mnesia, log, config and plugin files and its
// Erlang cookie under a temporary HOME, so it never meets a system broker.
// Its epmd is started as a child of the test and stopped with it. Under
// root the broker runs as the unprivileged "rabbitmq" user, which owns the
// directory.
//
// One broker per test binary (TestMain). Restart stops and starts the
// same node on the same ports and data, as a broker restart would.
package rmqtest

import "errors"

// ErrUnavailable means the binaries or the unprivileged user are missing, or
// the system is not a Unix.
var ErrUnavailable = errors.New("rmqtest: RabbitMQ unavailable")
