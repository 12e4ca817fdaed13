-- +goose Up
-- Device shadows (ingest/shadow): the state each device should have
-- (desired), set through the API. desired maps a property id to
-- {"value": <JSON value>, "time": <epoch ms>, "by": <user id>}; version
-- grows by one with every change of desired, in the statement that makes
-- the change, so a device (and a conditional PUT) can tell one state
-- from the next. What the device reports is not kept here: it is the
-- latest value of each property in ClickHouse (device_property), which
-- ingest writes anyway. A device without a row has version 0 and no
-- desired state. Deleting the device deletes its shadow.
CREATE TABLE device_shadows (
    device_id   TEXT PRIMARY KEY REFERENCES devices (id) ON DELETE CASCADE,
    version     BIGINT NOT NULL,
    desired     JSONB NOT NULL,
    update_time TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE device_shadows;
