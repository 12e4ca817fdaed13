-- +goose Up
-- Alarms (ingest/alarm). Rules are a product's; body is the rule as the
-- API reads and writes it (its trigger, clear and ladder), the columns
-- beside it what lists filter and sort on.
CREATE TABLE alarm_rules (
    id          TEXT PRIMARY KEY,
    product_id  TEXT NOT NULL,
    name        TEXT NOT NULL,
    severity    TEXT NOT NULL,
    enabled     BOOLEAN NOT NULL DEFAULT false,
    body        JSONB NOT NULL,
    creator_id  TEXT NOT NULL DEFAULT '',
    modifier_id TEXT NOT NULL DEFAULT '',
    create_time TIMESTAMPTZ NOT NULL DEFAULT now(),
    modify_time TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX alarm_rules_product ON alarm_rules (product_id, id);
CREATE INDEX alarm_rules_time ON alarm_rules (create_time DESC, id);

-- One row per alarm: raised, updated by repeats (count, last value and
-- time, severity) while active, then cleared (by a value or by hand) and
-- never reused. At most one active alarm per (rule, device): the
-- database says so, whatever any instance believes.
CREATE TABLE alarm_records (
    id            BIGSERIAL PRIMARY KEY,
    rule_id       TEXT NOT NULL,
    rule_name     TEXT NOT NULL,
    product_id    TEXT NOT NULL,
    device_id     TEXT NOT NULL,
    severity      TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('active', 'cleared')),
    count         BIGINT NOT NULL DEFAULT 1,
    first_value   TEXT NOT NULL DEFAULT '',
    last_value    TEXT NOT NULL DEFAULT '',
    raised_time   TIMESTAMPTZ NOT NULL,
    last_time     TIMESTAMPTZ NOT NULL,
    cleared_time  TIMESTAMPTZ,
    cleared_by    TEXT NOT NULL DEFAULT '', -- a user's name; '' when a value cleared it
    clear_value   TEXT NOT NULL DEFAULT '', -- the value that cleared it, or the hand's comment
    acked         BOOLEAN NOT NULL DEFAULT false,
    acked_time    TIMESTAMPTZ,
    acked_by      TEXT NOT NULL DEFAULT '',
    ack_comment   TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX alarm_records_active ON alarm_records (rule_id, device_id) WHERE state = 'active';
CREATE INDEX alarm_records_time ON alarm_records (raised_time DESC, id DESC);
CREATE INDEX alarm_records_product ON alarm_records (product_id, raised_time DESC);
CREATE INDEX alarm_records_device ON alarm_records (device_id, raised_time DESC);
CREATE INDEX alarm_records_cleared ON alarm_records (cleared_time) WHERE state = 'cleared';

-- Every transition of a record: raised, escalated, deescalated,
-- acknowledged, cleared; by a user (user_id, username) or by a value.
CREATE TABLE alarm_transitions (
    id        BIGSERIAL PRIMARY KEY,
    record_id BIGINT NOT NULL REFERENCES alarm_records (id) ON DELETE CASCADE,
    time      TIMESTAMPTZ NOT NULL,
    kind      TEXT NOT NULL,
    severity  TEXT NOT NULL,
    value     TEXT NOT NULL DEFAULT '',
    user_id   TEXT NOT NULL DEFAULT '',
    username  TEXT NOT NULL DEFAULT '',
    comment   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX alarm_transitions_record ON alarm_transitions (record_id, id);
-- The evaluator's owner polls clears by hand since the last it saw.
CREATE INDEX alarm_transitions_hand ON alarm_transitions (id) WHERE kind = 'cleared' AND user_id <> '';

-- The evaluator's state, written in the transaction that writes the
-- transitions it decided: per device (the latest message applied, the
-- keys of recent messages, the latest values its rules read) and per
-- (rule, device) (how long a condition has held, hits in a window, the
-- timer's deadline, whether an alarm is active). Compact JSON.
CREATE TABLE alarm_device_state (
    device_id  TEXT PRIMARY KEY,
    product_id TEXT NOT NULL,
    data       JSONB NOT NULL
);
CREATE TABLE alarm_rule_state (
    device_id TEXT NOT NULL,
    rule_id   TEXT NOT NULL,
    data      JSONB NOT NULL,
    PRIMARY KEY (device_id, rule_id)
);

-- The evaluator owner's fencing token: a new owner increments epoch; a
-- write of an owner whose epoch is no longer the table's is refused.
CREATE TABLE alarm_owner (
    id    INT PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL
);
INSERT INTO alarm_owner (id, epoch) VALUES (1, 0);

-- +goose Down
DROP TABLE alarm_owner;
DROP TABLE alarm_rule_state;
DROP TABLE alarm_device_state;
DROP TABLE alarm_transitions;
DROP TABLE alarm_records;
DROP TABLE alarm_rules;
