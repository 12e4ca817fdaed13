-- +goose Up
-- Forwarding rules (ingest/forward): a product's telemetry (property
-- reports, events, online/offline) sent to a webhook or another MQTT
-- broker. device_ids, types and properties narrow it ('{}': all). sink is
-- the sink's settings as the API reads and writes them, secret apart
-- (the webhook's HMAC key or the broker password, never read back).
CREATE TABLE forward_rules (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    product_id  TEXT NOT NULL REFERENCES products (id) ON DELETE CASCADE,
    device_ids  TEXT[] NOT NULL DEFAULT '{}',
    types       TEXT[] NOT NULL DEFAULT '{}',
    properties  TEXT[] NOT NULL DEFAULT '{}',
    kind        TEXT NOT NULL CHECK (kind IN ('webhook', 'mqtt')),
    sink        JSONB NOT NULL,
    secret      TEXT NOT NULL DEFAULT '',
    enabled     BOOLEAN NOT NULL DEFAULT true,
    creator_id  TEXT NOT NULL DEFAULT '',
    modifier_id TEXT NOT NULL DEFAULT '',
    create_time TIMESTAMPTZ NOT NULL DEFAULT now(),
    modify_time TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX forward_rules_product ON forward_rules (product_id);

-- +goose Down
DROP TABLE forward_rules;
