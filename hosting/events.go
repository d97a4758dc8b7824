package hosting

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Entities and routing keys of the bus (docs/hosting-events.md).
const (
	EntityAgent = "agent"
	EntityShare = "share"
	// RouteAgentDeleted is the routing key of an agent's deletion.
	RouteAgentDeleted = EntityAgent + "." + string(EventDeleted)
)

// EventMessage is an event as it goes on the bus: its id (the AMQP
// message_id), routing key, JSON body and time.
type EventMessage struct {
	ID         string
	RoutingKey string
	Body       []byte
	OccurredAt time.Time
}

// envelope is the body of every event.
type envelope struct {
	ID         string          `json:"id"`
	Type       EventType       `json:"type"`
	Entity     string          `json:"entity"`
	OccurredAt time.Time       `json:"occurredAt"`
	Data       json.RawMessage `json:"data"`
}

// ShareData is the data of a share event: the share after the change.
type ShareData struct {
	ID              string    `json:"id"`
	AccountID       string    `json:"accountId"`
	Kind            Kind      `json:"kind"`
	Name            string    `json:"name"`
	TargetAddress   string    `json:"targetAddress"`
	TargetPort      uint16    `json:"targetPort"`
	ActiveAgentIDs  []string  `json:"activeAgentIds"`
	PassiveAgentIDs []string  `json:"passiveAgentIds"`
	DeletedAt       time.Time `json:"deletedAt,omitzero"`
}

// AgentDeleted is the data of an agent DELETED event.
type AgentDeleted struct {
	AgentID   string `json:"agentId"`
	AccountID string `json:"accountId,omitempty"`
}

// ErrEvent means an event body is not the contract's.
var ErrEvent = errors.New("hosting: bad event")

// Message encodes a share event for the bus.
func (e Event) Message() (EventMessage, error) {
	h := e.Share.Hosts.Clone()
	d := ShareData{ID: e.Share.ID, AccountID: e.Share.AccountID, Kind: e.Share.Kind, Name: e.Share.Name, TargetAddress: e.Share.TargetAddress,
		TargetPort: e.Share.TargetPort, ActiveAgentIDs: h.Active, PassiveAgentIDs: h.Passive, DeletedAt: e.Share.DeletedAt}
	return encode(e.ID, e.Type, EntityShare, e.At, d)
}

// EventHostingStateChanged is the type of the event of a share whose
// hosting state changed (docs/hosting-events.md).
const EventHostingStateChanged EventType = "HOSTING_STATE_CHANGED"

// StateChange is a share's hosting state as the reconciler saw it change
// between two of its passes.
type StateChange struct {
	ID      string // a UUID, the message id on the bus
	Share   Share
	From    State
	To      State
	Hosting Hosting // the hosting block that shows To
	At      time.Time
}

// HostingStateData is the data of a HOSTING_STATE_CHANGED event: the
// share, the state before and after, and the hosts as Ziti has them.
type HostingStateData struct {
	ShareData
	From  State        `json:"from"`
	To    State        `json:"to"`
	Hosts []HostStatus `json:"hosts"`
}

// Message encodes a state change for the bus (routing key
// share.HOSTING_STATE_CHANGED).
func (c StateChange) Message() (EventMessage, error) {
	h := c.Share.Hosts.Clone()
	d := HostingStateData{ShareData: ShareData{ID: c.Share.ID, AccountID: c.Share.AccountID, Kind: c.Share.Kind, Name: c.Share.Name,
		TargetAddress: c.Share.TargetAddress, TargetPort: c.Share.TargetPort, ActiveAgentIDs: h.Active, PassiveAgentIDs: h.Passive},
		From: c.From, To: c.To, Hosts: c.Hosting.Hosts}
	if d.Hosts == nil {
		d.Hosts = []HostStatus{}
	}
	return encode(c.ID, EventHostingStateChanged, EntityShare, c.At, d)
}

// AgentDeletedMessage encodes an agent DELETED event (what the agent
// service publishes).
func AgentDeletedMessage(id string, d AgentDeleted, at time.Time) (EventMessage, error) {
	return encode(id, EventDeleted, EntityAgent, at, d)
}

func encode(id string, t EventType, entity string, at time.Time, data any) (EventMessage, error) {
	if id == "" {
		return EventMessage{}, fmt.Errorf("%w: event without id", ErrEvent)
	}
	db, err := json.Marshal(data)
	if err != nil {
		return EventMessage{}, fmt.Errorf("%w: %v", ErrEvent, err)
	}
	at = at.UTC()
	b, err := json.Marshal(envelope{ID: id, Type: t, Entity: entity, OccurredAt: at, Data: db})
	if err != nil {
		return EventMessage{}, fmt.Errorf("%w: %v", ErrEvent, err)
	}
	return EventMessage{ID: id, RoutingKey: entity + "." + string(t), Body: b, OccurredAt: at}, nil
}

// maxEventBytes bounds an event body.
const maxEventBytes = 64 << 10

// DecodeAgentDeleted decodes an agent DELETED body; anything else is
// ErrEvent (a permanent failure: no retry makes it valid).
func DecodeAgentDeleted(body []byte) (id string, d AgentDeleted, err error) {
	if len(body) > maxEventBytes {
		return "", d, fmt.Errorf("%w: body over %d bytes", ErrEvent, maxEventBytes)
	}
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return "", d, fmt.Errorf("%w: %v", ErrEvent, err)
	}
	if env.ID == "" || len(env.ID) > 128 {
		return "", d, fmt.Errorf("%w: bad event id %q", ErrEvent, env.ID)
	}
	if env.Entity != EntityAgent || env.Type != EventDeleted {
		return "", d, fmt.Errorf("%w: want an agent DELETED event, got %s %s", ErrEvent, env.Entity, env.Type)
	}
	if err := json.Unmarshal(env.Data, &d); err != nil {
		return "", d, fmt.Errorf("%w: data: %v", ErrEvent, err)
	}
	if d.AgentID == "" || len(d.AgentID) > maxAgentIDLength {
		return "", d, fmt.Errorf("%w: bad agentId %q", ErrEvent, d.AgentID)
	}
	return env.ID, d, nil
}

// OutboxTx is a transaction that can hold events: a Service with
// Options.Outbox writes the events of a change through it, in the
// change's transaction, so that a committed change always has its events.
type OutboxTx interface {
	AddEvents(ctx context.Context, msgs []EventMessage) error
}

// OutboxEntry is an outbox row: its sequence (commit order) and message.
type OutboxEntry struct {
	Seq int64
	EventMessage
}

// Outbox is the read side of the outbox, for the relay that publishes it.
type Outbox interface {
	// Pending returns up to limit unpublished entries, by sequence.
	Pending(ctx context.Context, limit int) ([]OutboxEntry, error)
	// MarkPublished marks entries published (the broker confirmed them).
	MarkPublished(ctx context.Context, seqs []int64, at time.Time) error
}

// RelayLock is the lock that the one relay publishing an outbox holds, so
// that the events of a share go out in commit order even with several
// replicas.
type RelayLock interface {
	// Held returns nil while the lock is still held; an error means it
	// may be lost (its session ended), and the relay must stop
	// publishing.
	Held(ctx context.Context) error
	// Unlock releases the lock.
	Unlock()
}

// RelayLocker takes the relay lock of an outbox; pgstore.Store is one (a
// PostgreSQL advisory lock).
type RelayLocker interface {
	// TryLockRelay takes the lock without waiting; ok is false when
	// another relay holds it.
	TryLockRelay(ctx context.Context) (l RelayLock, ok bool, err error)
}
