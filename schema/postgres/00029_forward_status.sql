-- +goose Up
-- A forwarding rule's status as the forwarder's owner (the instance that
-- holds its advisory lock and spool) last wrote it, about every second:
-- what any instance's API answers. lag_ms is the age of the oldest
-- message not yet accepted by the sink (0: caught up).
CREATE TABLE forward_status (
    rule_id       TEXT PRIMARY KEY REFERENCES forward_rules (id) ON DELETE CASCADE,
    owner         TEXT NOT NULL,
    lag_ms        BIGINT NOT NULL DEFAULT 0,
    pending       BIGINT NOT NULL DEFAULT 0,
    spooled_bytes BIGINT NOT NULL DEFAULT 0,
    dropped       BIGINT NOT NULL DEFAULT 0,
    sent          BIGINT NOT NULL DEFAULT 0,
    failed        BIGINT NOT NULL DEFAULT 0,
    last_error    TEXT NOT NULL DEFAULT '',
    update_time   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE forward_status;
