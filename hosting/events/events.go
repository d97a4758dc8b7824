// Package events puts share hosts on RabbitMQ (through amqp091-go), by
// the contract in docs/hosting-events.md:
//
//   - Consumer takes the events hosting consumes (hosting.IntakeRoutes:
//     agents created, updated and deleted, accounts and frontdoors
//     deleted) from a quorum queue, checks each against the intake
//     schema and runs it (hosting.Service.HandleIntake, exactly once
//     through the inbox), acknowledging only after its transaction
//     committed. A transient failure is requeued, and after the queue's
//     x-delivery-limit the broker dead-letters it; a permanent one (a
//     body that fails the schema, the controller's "config is in use by
//     identity" ordering fault) is dead-lettered at once with its reason
//     (HeaderError). A redelivered event finds nothing to do.
//   - Relay publishes the outbox (hosting.Outbox, written in the change's
//     transaction) in commit order with publisher confirms, and marks a row
//     published only once the broker confirmed it.
//
// Both reconnect after a broker restart, with a backoff on their clock,
// and redeclare the topology.
//
// Usage:
//
//	svc, _ := hosting.NewService(hosting.Options{Store: st, Projection: p, Outbox: true})
//	c, _ := events.NewConsumer(events.ConsumerOptions{URL: url, Handler: svc})
//	r, _ := events.NewRelay(events.RelayOptions{URL: url, Outbox: st})
//	go c.Run(ctx)
//	go r.Run(ctx)
package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/internal/failpoint"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/transport"
)

// Topology names the exchanges and queues of the contract.
type Topology struct {
	Exchange           string // topic exchange of every event
	DeadLetterExchange string // fanout exchange of dead letters
	Queue              string // quorum queue of every event hosting consumes (hosting.IntakeRoutes)
	DeadLetterQueue    string // quorum queue bound to DeadLetterExchange
	DeliveryLimit      int    // x-delivery-limit of Queue
}

// DefaultTopology is the contract's topology.
func DefaultTopology() Topology {
	return Topology{Exchange: "vipkit.events", DeadLetterExchange: "vipkit.events.dlx", Queue: "vipkit.hosting.agent-deleted",
		DeadLetterQueue: "vipkit.hosting.agent-deleted.dlq", DeliveryLimit: 5}
}

var (
	// ErrInvalidOptions means a consumer, a relay or a topology was given
	// options that are missing or out of range.
	ErrInvalidOptions = errors.New("events: invalid options")
	// ErrOptions is another name for ErrInvalidOptions: the same error
	// value, so errors.Is matches either.
	//
	// Deprecated: use ErrInvalidOptions.
	ErrOptions = ErrInvalidOptions
)

func (t Topology) check() error {
	if t.Exchange == "" || t.DeadLetterExchange == "" || t.Queue == "" || t.DeadLetterQueue == "" || t.DeliveryLimit < 1 {
		return fmt.Errorf("%w: topology %+v", ErrInvalidOptions, t)
	}
	return nil
}

// DeclareExchange declares the events exchange.
func (t Topology) DeclareExchange(ch *amqp.Channel) error {
	return ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
}

// Declare declares the whole topology: both exchanges, both quorum queues
// and the bindings. It is idempotent.
func (t Topology) Declare(ch *amqp.Channel) error {
	if err := t.DeclareExchange(ch); err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(t.DeadLetterExchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(t.DeadLetterQueue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return err
	}
	if err := ch.QueueBind(t.DeadLetterQueue, "", t.DeadLetterExchange, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-delivery-limit": int64(t.DeliveryLimit), "x-dead-letter-exchange": t.DeadLetterExchange,
	}); err != nil {
		return err
	}
	for _, key := range hosting.IntakeRoutes() {
		if err := ch.QueueBind(t.Queue, key, t.Exchange, false, nil); err != nil {
			return err
		}
	}
	return nil
}

// Handler applies consumed events; *hosting.Service is one
// (Service.HandleIntake: exactly once in its store, through the inbox).
type Handler interface {
	HandleIntake(ctx context.Context, in hosting.Intake) ([]hosting.Event, error)
}

// Permanent reports whether a failure of the handler cannot be fixed by a
// retry: a body that is not the contract, or the controller's 500 "config
// is in use by identity" (an ordering fault).
func Permanent(err error) bool {
	return errors.Is(err, hosting.ErrEvent) || errors.Is(err, ziti.ErrConfigInUse)
}

// Headers the consumer puts on a message it dead-letters itself (a
// permanent failure), beside the message's own headers.
const (
	// HeaderDeathReason is "rejected", like the broker's
	// x-first-death-reason.
	HeaderDeathReason = "x-vipkit-death-reason"
	// HeaderError is why: the schema violation or the handler's error,
	// on one line, at most 1 KiB.
	HeaderError = "x-vipkit-error"
	// HeaderQueue is the queue the message was consumed from.
	HeaderQueue = "x-vipkit-queue"
)

// ConsumerOptions configure a Consumer.
type ConsumerOptions struct {
	URL      string   // AMQP URL (required)
	Handler  Handler  // required
	Topology Topology // zero means DefaultTopology
	Clock    transport.Clock
	// Backoff is the first wait before a reconnect, doubled up to 30 s;
	// 0 means 500 ms.
	Backoff time.Duration
	// RetryDelay is how long a transient failure waits before it is
	// requeued; 0 means one second.
	RetryDelay time.Duration
	// HandlerTimeout bounds one cascade, which runs to its end even when
	// Run's context is cancelled (so that a committed cascade is acked);
	// 0 means two minutes.
	HandlerTimeout time.Duration
	// OnError, when set, is told of every failure (for logs and metrics).
	OnError func(error)
}

// ConsumerStats count what the consumer did.
type ConsumerStats struct {
	Acked        int64 // handled and committed (or nothing to do)
	Requeued     int64 // transient failures sent back to the queue
	DeadLettered int64 // permanent failures sent to the dead-letter exchange
	Connects     int64 // successful connections (1 + reconnects)
}

// Consumer consumes agent DELETED events. Run it once.
type Consumer struct {
	o                               ConsumerOptions
	clk                             transport.Clock
	acked, requeued, dead, connects atomic.Int64
}

// NewConsumer checks the options and returns a consumer.
func NewConsumer(o ConsumerOptions) (*Consumer, error) {
	if o.URL == "" || o.Handler == nil {
		return nil, fmt.Errorf("%w: a consumer needs a URL and a handler", ErrInvalidOptions)
	}
	if o.Topology == (Topology{}) {
		o.Topology = DefaultTopology()
	}
	if err := o.Topology.check(); err != nil {
		return nil, err
	}
	if o.Backoff <= 0 {
		o.Backoff = 500 * time.Millisecond
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = time.Second
	}
	if o.HandlerTimeout <= 0 {
		o.HandlerTimeout = 2 * time.Minute
	}
	return &Consumer{o: o, clk: transport.Or(o.Clock)}, nil
}

// Stats returns the counters.
func (c *Consumer) Stats() ConsumerStats {
	return ConsumerStats{Acked: c.acked.Load(), Requeued: c.requeued.Load(), DeadLettered: c.dead.Load(), Connects: c.connects.Load()}
}

func report(f func(error), err error) {
	if f != nil && err != nil {
		f(err)
	}
}

// loop runs connect until ctx is done, again after each failure with a
// doubling backoff. It returns ctx's error.
func loop(ctx context.Context, connect func(context.Context) error, clk transport.Clock, backoff time.Duration, onErr func(error)) error {
	wait := backoff
	for {
		err := connect(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		report(onErr, err)
		if err == nil {
			wait = backoff
		}
		if !transport.Sleep(clk, wait, ctx.Done()) {
			return ctx.Err()
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// Run consumes until ctx is done; it returns ctx's error.
func (c *Consumer) Run(ctx context.Context) error {
	return loop(ctx, c.session, c.clk, c.o.Backoff, c.o.OnError)
}

// session is one connection's life: declare, consume, handle, until the
// connection or ctx ends.
func (c *Consumer) session(ctx context.Context) error {
	conn, err := amqp.DialConfig(c.o.URL, amqp.Config{Heartbeat: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("events: consumer: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("events: consumer: channel: %w", err)
	}
	if err := c.o.Topology.Declare(ch); err != nil {
		return fmt.Errorf("events: consumer: declare: %w", err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return fmt.Errorf("events: consumer: qos: %w", err)
	}
	// Confirm mode, for the dead letters this consumer publishes itself.
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("events: consumer: confirm mode: %w", err)
	}
	ds, err := ch.ConsumeWithContext(ctx, c.o.Topology.Queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("events: consumer: consume: %w", err)
	}
	c.connects.Add(1)
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-ds:
			if !ok {
				return fmt.Errorf("events: consumer: the delivery channel closed")
			}
			if err := c.handle(ctx, ch, d); err != nil {
				return err
			}
		}
	}
}

// decode checks a delivery: its body against the intake schema, and its
// message_id, when set, against the body's id.
func decode(d amqp.Delivery) (hosting.Intake, error) {
	in, err := hosting.DecodeIntake(d.Body)
	if err != nil {
		return in, err
	}
	if d.MessageId != "" && d.MessageId != in.ID {
		return in, fmt.Errorf("%w: message_id %q is not the body's id %q", hosting.ErrEvent, d.MessageId, in.ID)
	}
	if d.RoutingKey != in.RoutingKey() {
		return in, fmt.Errorf("%w: routing key %q is not the body's %s", hosting.ErrEvent, d.RoutingKey, in.RoutingKey())
	}
	return in, nil
}

// handle runs one delivery and settles it; an error means the channel is
// unusable (the delivery is then redelivered by the broker).
func (c *Consumer) handle(ctx context.Context, ch *amqp.Channel, d amqp.Delivery) error {
	in, err := decode(d)
	if err == nil {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.HandlerTimeout)
		_, err = c.o.Handler.HandleIntake(hctx, in)
		cancel()
		if err == nil {
			err = failpoint.Eval(failpoint.BeforeAck)
		}
	}
	switch {
	case err == nil:
		if err := d.Ack(false); err != nil {
			return fmt.Errorf("events: consumer: ack: %w", err)
		}
		c.acked.Add(1)
	case Permanent(err):
		report(c.o.OnError, fmt.Errorf("events: %s %s dead-lettered: %w", d.RoutingKey, d.MessageId, err))
		if err := c.deadLetter(ctx, ch, d, err); err != nil {
			return err
		}
		c.dead.Add(1)
	default:
		report(c.o.OnError, fmt.Errorf("events: %s %s requeued: %w", d.RoutingKey, d.MessageId, err))
		transport.Sleep(c.clk, c.o.RetryDelay, ctx.Done())
		if err := d.Nack(false, true); err != nil {
			return fmt.Errorf("events: consumer: nack: %w", err)
		}
		c.requeued.Add(1)
	}
	return nil
}

// maxReason bounds the error header of a dead letter.
const maxReason = 1024

// deadLetter publishes d to the dead-letter exchange with its reason
// (confirmed), then acknowledges it. A crash between the two leaves the
// delivery unacknowledged: it is redelivered and dead-lettered again.
func (c *Consumer) deadLetter(ctx context.Context, ch *amqp.Channel, d amqp.Delivery, why error) error {
	reason := strings.Join(strings.Fields(why.Error()), " ")
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	h[HeaderDeathReason], h[HeaderError], h[HeaderQueue] = "rejected", reason, c.o.Topology.Queue
	p := amqp.Publishing{Headers: h, ContentType: d.ContentType, DeliveryMode: amqp.Persistent, MessageId: d.MessageId, Type: d.Type, Timestamp: d.Timestamp, Body: d.Body}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.HandlerTimeout)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(pctx, c.o.Topology.DeadLetterExchange, d.RoutingKey, false, false, p)
	if err != nil {
		return fmt.Errorf("events: consumer: dead-letter: %w", err)
	}
	if ok, err := dc.WaitContext(pctx); err != nil || !ok {
		return fmt.Errorf("events: consumer: the dead letter of %s was not confirmed (%v)", d.MessageId, err)
	}
	if err := d.Ack(false); err != nil {
		return fmt.Errorf("events: consumer: ack: %w", err)
	}
	return nil
}

// Publish publishes msg on the exchange of ch (a channel in confirm mode)
// and waits for the broker's confirm.
func Publish(ctx context.Context, ch *amqp.Channel, exchange string, msg hosting.EventMessage) error {
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, msg.RoutingKey, true, false, publishing(msg))
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("events: the broker refused %s", msg.ID)
	}
	return nil
}

func publishing(m hosting.EventMessage) amqp.Publishing {
	return amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: m.ID, Type: m.RoutingKey, Timestamp: m.OccurredAt, Body: m.Body}
}

// RelayOptions configure a Relay.
type RelayOptions struct {
	URL      string         // AMQP URL (required)
	Outbox   hosting.Outbox // required
	Exchange string         // "" means DefaultTopology().Exchange
	Clock    transport.Clock
	// Poll is the wait between two looks at an empty outbox; 0 means
	// 200 ms.
	Poll time.Duration
	// Batch is how many rows one round publishes; 0 means 100.
	Batch int
	// Backoff is the first wait before a reconnect; 0 means 500 ms.
	Backoff time.Duration
	// Lock, when set, is the outbox's relay lock: the relay publishes
	// only while it holds it, so that with several replicas one relay
	// runs at a time and a share's events keep their order. Without it
	// every relay on the outbox publishes.
	Lock hosting.RelayLocker
	// Standby is how often a relay without the lock tries to take it;
	// 0 means one second.
	Standby time.Duration
	// OnLock, when set, is told when the relay takes the lock (true) and
	// when it stops holding it (false).
	OnLock  func(held bool)
	OnError func(error)
}

// RelayStats count what the relay did.
type RelayStats struct {
	Published int64 // confirmed and marked
	Returned  int64 // returned by the broker: no queue was bound for them
	Connects  int64
	Leads     int64 // times it took the relay lock
	Lost      int64 // times it found the lock lost while holding it
}

// errLockLost means the relay lock was lost: the relay stops publishing.
var errLockLost = errors.New("events: relay: the relay lock was lost")

// Relay publishes the outbox. Run it once.
type Relay struct {
	o                             RelayOptions
	clk                           transport.Clock
	published, returned, connects atomic.Int64
	leads, lost                   atomic.Int64
	kick                          chan struct{}
}

// NewRelay checks the options and returns a relay.
func NewRelay(o RelayOptions) (*Relay, error) {
	if o.URL == "" || o.Outbox == nil {
		return nil, fmt.Errorf("%w: a relay needs a URL and an outbox", ErrInvalidOptions)
	}
	if o.Exchange == "" {
		o.Exchange = DefaultTopology().Exchange
	}
	if o.Poll <= 0 {
		o.Poll = 200 * time.Millisecond
	}
	if o.Batch <= 0 {
		o.Batch = 100
	}
	if o.Backoff <= 0 {
		o.Backoff = 500 * time.Millisecond
	}
	if o.Standby <= 0 {
		o.Standby = time.Second
	}
	return &Relay{o: o, clk: transport.Or(o.Clock), kick: make(chan struct{}, 1)}, nil
}

// Stats returns the counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Published: r.published.Load(), Returned: r.returned.Load(), Connects: r.connects.Load(), Leads: r.leads.Load(), Lost: r.lost.Load()}
}

// Kick makes the relay look at the outbox now rather than at its next
// poll (call it after a commit that wrote events).
func (r *Relay) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run publishes until ctx is done; it returns ctx's error. With a Lock,
// it waits as a standby until it takes the lock, publishes while it holds
// it, and goes back to standby when it finds it lost.
func (r *Relay) Run(ctx context.Context) error {
	if r.o.Lock == nil {
		return loop(ctx, func(ctx context.Context) error { return r.session(ctx, nil) }, r.clk, r.o.Backoff, r.o.OnError)
	}
	for {
		l, ok, err := r.o.Lock.TryLockRelay(ctx)
		if ctx.Err() != nil {
			if ok {
				l.Unlock()
			}
			return ctx.Err()
		}
		report(r.o.OnError, err)
		if ok {
			r.lead(ctx, l)
		}
		if !transport.Sleep(r.clk, r.o.Standby, ctx.Done()) {
			return ctx.Err()
		}
	}
}

// lead publishes under the lock l until ctx is done or the lock is lost,
// then releases it.
func (r *Relay) lead(ctx context.Context, l hosting.RelayLock) {
	r.leads.Add(1)
	if r.o.OnLock != nil {
		r.o.OnLock(true)
	}
	lctx, cancel := context.WithCancel(ctx)
	_ = loop(lctx, func(ctx context.Context) error {
		err := r.session(ctx, l)
		if errors.Is(err, errLockLost) {
			r.lost.Add(1)
			cancel()
		}
		return err
	}, r.clk, r.o.Backoff, r.o.OnError)
	cancel()
	l.Unlock()
	if r.o.OnLock != nil {
		r.o.OnLock(false)
	}
}

func (r *Relay) session(ctx context.Context, l hosting.RelayLock) error {
	conn, err := amqp.DialConfig(r.o.URL, amqp.Config{Heartbeat: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("events: relay: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("events: relay: channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("events: relay: confirm mode: %w", err)
	}
	if err := (Topology{Exchange: r.o.Exchange}).DeclareExchange(ch); err != nil {
		return fmt.Errorf("events: relay: declare: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	go func() {
		for ret := range returns {
			r.returned.Add(1)
			report(r.o.OnError, fmt.Errorf("events: %s %s returned: %s", ret.Type, ret.MessageId, ret.ReplyText))
		}
	}()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	r.connects.Add(1)
	for {
		if l != nil {
			if err := l.Held(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("%w: %v", errLockLost, err)
			}
		}
		n, err := r.round(ctx, ch)
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		t := r.clk.AfterFunc(r.o.Poll, r.Kick)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case e := <-closed:
			t.Stop()
			return fmt.Errorf("events: relay: connection closed: %v", e)
		case <-r.kick:
			t.Stop()
		}
	}
}

// round publishes one batch: every message, then every confirm, then the
// confirmed prefix is marked published. It returns how many it marked.
func (r *Relay) round(ctx context.Context, ch *amqp.Channel) (int, error) {
	pend, err := r.o.Outbox.Pending(ctx, r.o.Batch)
	if err != nil || len(pend) == 0 {
		return 0, err
	}
	dcs := make([]*amqp.DeferredConfirmation, 0, len(pend))
	for _, e := range pend {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, r.o.Exchange, e.RoutingKey, true, false, publishing(e.EventMessage))
		if err != nil {
			break
		}
		dcs = append(dcs, dc)
	}
	var seqs []int64
	var ferr error
	for i, dc := range dcs {
		ok, err := dc.WaitContext(ctx)
		if err != nil || !ok {
			ferr = fmt.Errorf("events: relay: %s not confirmed (%v)", pend[i].ID, err)
			break
		}
		seqs = append(seqs, pend[i].Seq)
	}
	if len(seqs) > 0 {
		if err := r.o.Outbox.MarkPublished(context.WithoutCancel(ctx), seqs, r.clk.Now()); err != nil {
			return 0, err
		}
		r.published.Add(int64(len(seqs)))
	}
	if ferr == nil && len(dcs) < len(pend) {
		ferr = errors.New("events: relay: a publish failed")
	}
	return len(seqs), ferr
}
