package rmqtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vipkit/vipkit/hosting/events/rmqtest"
	"github.com/vipkit/vipkit/internal/testenv"
)

func TestStartRestartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := rmqtest.Start(ctx)
	if errors.Is(err, rmqtest.ErrUnavailable) {
		testenv.Skip(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	}()
	c, err := amqp.Dial(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := c.Channel()
	if _, err := ch.QueueDeclare("q", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, "", "q", false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("kept")}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	c, err = amqp.Dial(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, _ = c.Channel()
	m, ok, err := ch.Get("q", true)
	if err != nil || !ok || string(m.Body) != "kept" {
		t.Fatalf("after a restart: %q %v %v", m.Body, ok, err)
	}
}
