-- Consumed events: one row per event whose effect committed, written in
-- that effect's transaction, so a redelivered event (or one handled by
-- two replicas) changes nothing the second time. Rows older than the
-- retention are pruned (Store.PruneInbox).
CREATE TABLE inbox (
    event_id     text PRIMARY KEY,
    routing_key  text NOT NULL,
    occurred_at  timestamptz NOT NULL,
    handled_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX inbox_handled_idx ON inbox (handled_at);

-- The time of the last agent event applied to the row, so that an older
-- event handled after a newer one (by another replica) changes nothing.
ALTER TABLE agent ADD COLUMN event_at timestamptz;
