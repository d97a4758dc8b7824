package events_test

import (
	"context"
	"log"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/events"
	"github.com/vipkit/vipkit/hosting/pgstore"
)

// Consume the events hosting takes (agents, accounts, frontdoors) and relay the outbox of a service that
// writes its events in the change's transaction.
func Example() {
	var st *pgstore.Store        // pgstore.New(pool, pgstore.Options{})
	var proj *hosting.Projection // hosting.NewProjection(...)
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: proj, Outbox: true})
	if err != nil {
		log.Fatal(err)
	}
	url := "amqp://hosting:secret@127.0.0.1:5672/"
	c, err := events.NewConsumer(events.ConsumerOptions{URL: url, Handler: svc})
	if err != nil {
		log.Fatal(err)
	}
	r, err := events.NewRelay(events.RelayOptions{URL: url, Outbox: st})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	go func() { _ = c.Run(ctx) }()
	_ = r.Run(ctx)
}
