-- Active and passive hosts: one host table for every share type.
-- share_id has no foreign key: shares are soft-deleted, and every insert
-- runs in the transaction of its share.
CREATE TABLE host (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    share_id    uuid NOT NULL,
    agent_id    text NOT NULL CONSTRAINT host_agent_fk REFERENCES agent (id),
    role        text NOT NULL CHECK (role IN ('ACTIVE', 'PASSIVE')),
    created_by  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_by  text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    deleted_by  text,
    deleted_at  timestamptz
);

-- One agent holds one role on one share (live rows).
CREATE UNIQUE INDEX host_share_agent_uq ON host (share_id, agent_id) WHERE deleted_at IS NULL;
CREATE INDEX host_agent_idx ON host (agent_id) WHERE deleted_at IS NULL;

-- Every share keeps its agent, as its ACTIVE host.
INSERT INTO host (share_id, agent_id, role, created_by, created_at, updated_by, updated_at)
SELECT id, agent_id, 'ACTIVE', 'V1.0.14', created_at, 'V1.0.14', created_at
FROM share
WHERE agent_id IS NOT NULL;

ALTER TABLE share DROP CONSTRAINT share_agent_fk;
DROP INDEX share_agent_idx;
ALTER TABLE share DROP COLUMN agent_id;
