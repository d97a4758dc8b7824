package hosting

import (
	"bytes"
	"context"
	_ "embed" // the intake schema
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The entities and routing keys hosting consumes (docs/hosting-events.md).
const (
	EntityAccount   = "account"
	EntityFrontdoor = "frontdoor"
	// EventCreated is the type of an agent's creation.
	EventCreated EventType = "CREATED"

	RouteAgentCreated     = EntityAgent + "." + string(EventCreated)
	RouteAgentUpdated     = EntityAgent + "." + string(EventUpdated)
	RouteAccountDeleted   = EntityAccount + "." + string(EventDeleted)
	RouteFrontdoorDeleted = EntityFrontdoor + "." + string(EventDeleted)
)

// IntakeRoutes returns the routing keys of every event hosting consumes,
// sorted.
func IntakeRoutes() []string {
	return []string{RouteAccountDeleted, RouteAgentCreated, RouteAgentDeleted, RouteAgentUpdated, RouteFrontdoorDeleted}
}

// Intake is an event hosting consumes, decoded and checked against its
// schema: an agent created, updated or deleted, an account deleted, or a
// frontdoor deleted.
type Intake struct {
	ID          string // the event's id: the inbox key that makes its effect happen once
	Entity      string // EntityAgent, EntityAccount or EntityFrontdoor
	Type        EventType
	At          time.Time // occurredAt
	AgentID     string    // agent events
	AccountID   string    // agent CREATED and UPDATED (required), agent DELETED (optional), account DELETED
	FrontdoorID string    // frontdoor DELETED
}

// RoutingKey is the event's routing key, <entity>.<TYPE>.
func (in Intake) RoutingKey() string { return in.Entity + "." + string(in.Type) }

// intakeData holds every field of an intake event's data.
type intakeData struct {
	AgentID     string `json:"agentId,omitempty"`
	AccountID   string `json:"accountId,omitempty"`
	FrontdoorID string `json:"frontdoorId,omitempty"`
}

// Message encodes the event for the bus, as its producer does.
func (in Intake) Message() (EventMessage, error) {
	return encode(in.ID, in.Type, in.Entity, in.At, intakeData{AgentID: in.AgentID, AccountID: in.AccountID, FrontdoorID: in.FrontdoorID})
}

//go:embed schema/intake.schema.json
var intakeSchemaJSON []byte

// IntakeSchema returns the JSON Schema (draft 2020-12) every consumed
// event's body is checked against.
func IntakeSchema() []byte { return bytes.Clone(intakeSchemaJSON) }

var intakeSchema = sync.OnceValues(func() (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(intakeSchemaJSON))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	const url = "file:///intake.schema.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	return c.Compile(url)
})

// DecodeIntake checks an event body against the intake schema and decodes
// it. A body over 64 KiB, not JSON, or not the schema's is ErrEvent, with
// the reason (a permanent failure: no retry makes it valid). Unknown
// fields are allowed, so producers may add some.
func DecodeIntake(body []byte) (Intake, error) {
	if len(body) > maxEventBytes {
		return Intake{}, fmt.Errorf("%w: body over %d bytes", ErrEvent, maxEventBytes)
	}
	sch, err := intakeSchema()
	if err != nil {
		return Intake{}, fmt.Errorf("hosting: the intake schema does not compile: %w", err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return Intake{}, fmt.Errorf("%w: not JSON: %v", ErrEvent, err)
	}
	if err := sch.Validate(inst); err != nil {
		return Intake{}, fmt.Errorf("%w: %s", ErrEvent, schemaReason(err))
	}
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Intake{}, fmt.Errorf("%w: %v", ErrEvent, err)
	}
	var d intakeData
	if err := json.Unmarshal(env.Data, &d); err != nil {
		return Intake{}, fmt.Errorf("%w: data: %v", ErrEvent, err)
	}
	return Intake{ID: env.ID, Entity: env.Entity, Type: env.Type, At: env.OccurredAt.UTC(),
		AgentID: d.AgentID, AccountID: d.AccountID, FrontdoorID: d.FrontdoorID}, nil
}

// schemaReason is a validation error on one line.
func schemaReason(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	s = strings.TrimPrefix(s, "jsonschema validation failed with 'file:///intake.schema.json#' ")
	if len(s) > 1024 {
		s = s[:1024] + "…"
	}
	return "does not match the intake schema: " + s
}

// IntakeTx is a transaction that can record consumed events and agents:
// a Service handles intake events only on a store whose Tx implements it
// (pgstore and MemStore do).
type IntakeTx interface {
	// ClaimEvent records the event id in the inbox. It reports false when
	// the id is there already (the event's effect happened), and blocks
	// while another transaction holds the same claim uncommitted.
	ClaimEvent(ctx context.Context, id, routingKey string, at time.Time) (bool, error)
	// Handled reports whether the event id is in the inbox: its effect
	// committed. Unlike ClaimEvent it claims nothing.
	Handled(ctx context.Context, id string) (bool, error)
	// ApplyAgent writes an agent row as of event time at: a live agent
	// is created or updated unless the row holds a newer event or is
	// deleted (deleted is final); a deleted one is marked deleted. It
	// reports whether the row changed.
	ApplyAgent(ctx context.Context, a Agent, at time.Time) (bool, error)
	// DeleteAgentsOfAccount marks every live agent of an account deleted.
	DeleteAgentsOfAccount(ctx context.Context, account string, at time.Time) error
	// LiveShareIDs lists the ids of every live share, sorted.
	LiveShareIDs(ctx context.Context) ([]string, error)
}

// intakeKey carries the event a change is made for.
type intakeKey struct{}

type intakeCtx struct {
	in  Intake
	pre func(ctx context.Context, tx IntakeTx) error // runs after the claim
}

// HandleIntake applies one consumed event, exactly once in the store: its
// id is claimed in the inbox in the transaction of its effect, so a
// redelivery, or the same event handled by two replicas, changes nothing
// the second time. It returns the share events the change wrote.
//
//   - agent CREATED, UPDATED: the agent row, live in its account, unless a
//     newer event or its deletion was applied first (events of one agent
//     may arrive out of order when several replicas consume).
//   - agent DELETED: the agent is marked deleted and the agent cascade
//     runs (RemoveDeletedAgent), in one transaction.
//   - account DELETED: every agent of the account is marked deleted and
//     every share of it deleted (RemoveAccount), in one transaction.
//   - frontdoor DELETED: for this service's frontdoor, every share is
//     deleted (the network gate decides whether Ziti is cleaned up);
//     another frontdoor's event is recorded and changes nothing.
func (sv *Service) HandleIntake(ctx context.Context, in Intake) ([]Event, error) {
	if in.ID == "" {
		return nil, fmt.Errorf("%w: event without id", ErrEvent)
	}
	ic := &intakeCtx{in: in}
	ctx = context.WithValue(ctx, intakeKey{}, ic)
	switch in.RoutingKey() {
	case RouteAgentCreated, RouteAgentUpdated:
		ic.pre = func(ctx context.Context, tx IntakeTx) error {
			_, err := tx.ApplyAgent(ctx, Agent{ID: in.AgentID, AccountID: in.AccountID}, in.At)
			return err
		}
		_, err := sv.run(ctx, func(context.Context, Tx, *[]change) error { return nil })
		return nil, err
	case RouteAgentDeleted:
		ic.pre = func(ctx context.Context, tx IntakeTx) error {
			_, err := tx.ApplyAgent(ctx, Agent{ID: in.AgentID, AccountID: in.AccountID, Deleted: true}, in.At)
			return err
		}
		return sv.RemoveDeletedAgent(ctx, in.AgentID)
	case RouteAccountDeleted:
		ic.pre = func(ctx context.Context, tx IntakeTx) error {
			return tx.DeleteAgentsOfAccount(ctx, in.AccountID, in.At)
		}
		return sv.RemoveAccount(ctx, in.AccountID)
	case RouteFrontdoorDeleted:
		if in.FrontdoorID != sv.pr.o.FrontdoorID {
			_, err := sv.run(ctx, func(context.Context, Tx, *[]change) error { return nil })
			return nil, err
		}
		return sv.cascade(ctx,
			func(ctx context.Context) ([]Share, error) { return sv.st.Find(ctx, Filter{}) },
			func(ctx context.Context, tx Tx) ([]string, error) { return tx.(IntakeTx).LiveShareIDs(ctx) },
			func(ctx context.Context, tx Tx, cur Share, done *[]change) error {
				if !cur.Live() {
					return nil
				}
				return sv.remove(ctx, tx, cur, done)
			})
	}
	return nil, fmt.Errorf("%w: hosting does not consume %s", ErrEvent, in.RoutingKey())
}

// handledIntake reports whether ctx carries an intake event whose effect
// committed already. A cascade asks before its teardown outside the
// transaction, so a redelivered event touches no ingress; the claim in
// the transaction still decides whether the store changes.
func (sv *Service) handledIntake(ctx context.Context) (bool, error) {
	ic, ok := ctx.Value(intakeKey{}).(*intakeCtx)
	if !ok {
		return false, nil
	}
	var done bool
	err := sv.st.InTx(ctx, func(ctx context.Context, tx Tx) error {
		itx, ok := tx.(IntakeTx)
		if !ok {
			return fmt.Errorf("%w: the store's transactions hold no inbox", ErrStore)
		}
		var err error
		done, err = itx.Handled(ctx, ic.in.ID)
		return err
	})
	return done, err
}

// claimIntake runs first in the transaction of a change made for an
// intake event: it claims the event's id and reports whether the change
// must be skipped (the event was handled already).
func claimIntake(ctx context.Context, tx Tx) (skip bool, err error) {
	ic, ok := ctx.Value(intakeKey{}).(*intakeCtx)
	if !ok {
		return false, nil
	}
	itx, ok := tx.(IntakeTx)
	if !ok {
		return false, fmt.Errorf("%w: the store's transactions hold no inbox", ErrStore)
	}
	first, err := itx.ClaimEvent(ctx, ic.in.ID, ic.in.RoutingKey(), ic.in.At)
	if err != nil || !first {
		return !first, err
	}
	if ic.pre != nil {
		return false, ic.pre(ctx, itx)
	}
	return false, nil
}
