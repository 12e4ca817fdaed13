-- +goose Up
-- The firmware version each device last reported on firmware/version
-- (ingest/firmware), and when; the engine's owner fencing token (as
-- alarm_owner: a new owner increments epoch, and a start made under an
-- older epoch is refused); the key that signs download tokens, made once
-- and shared by every instance.
CREATE TABLE device_firmware (
    device_id   TEXT PRIMARY KEY REFERENCES devices (id) ON DELETE CASCADE,
    version     TEXT NOT NULL,
    report_time TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE firmware_owner (
    id    INT PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL,
    token_key BYTEA
);
INSERT INTO firmware_owner (id, epoch) VALUES (1, 0);

-- +goose Down
DROP TABLE firmware_owner;
DROP TABLE device_firmware;
