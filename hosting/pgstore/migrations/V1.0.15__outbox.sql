-- Share events, written in the transaction of the change they tell of and
-- published by a relay in seq (commit) order; published_at is set once
-- the broker confirmed the message.
CREATE TABLE outbox (
    seq           bigserial PRIMARY KEY,
    event_id      uuid NOT NULL UNIQUE,
    routing_key   text NOT NULL,
    body          bytea NOT NULL,
    occurred_at   timestamptz NOT NULL,
    published_at  timestamptz
);

CREATE INDEX outbox_pending_idx ON outbox (seq) WHERE published_at IS NULL;
