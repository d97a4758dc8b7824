-- Shares before hosts: each share names its one agent in agent_id.
CREATE TABLE agent (
    id          text PRIMARY KEY,
    account_id  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);

CREATE TABLE share (
    id              uuid PRIMARY KEY,
    account_id      text NOT NULL,
    name            text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 164),
    kind            text NOT NULL CHECK (kind IN ('tcp', 'ipsec', 'http')),
    target_address  text NOT NULL,
    target_port     integer NOT NULL CHECK (target_port BETWEEN 1 AND 65535),
    agent_id        text CONSTRAINT share_agent_fk REFERENCES agent (id),
    created_by      text,
    created_at      timestamptz NOT NULL,
    updated_by      text,
    updated_at      timestamptz NOT NULL,
    deleted_by      text,
    deleted_at      timestamptz
);

CREATE INDEX share_agent_idx ON share (agent_id);
CREATE INDEX share_account_idx ON share (account_id) WHERE deleted_at IS NULL;
