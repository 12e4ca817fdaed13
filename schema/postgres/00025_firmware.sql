-- +goose Up
-- Firmware updates (ingest/firmware). A package is one firmware file of a
-- product: its bytes live in the directory of DEVICEHUB_FIRMWARE_DIR under
-- file_name (README "Firmware updates" says why a directory and not large
-- objects); size and sha256 are computed on upload. A version is unique
-- per product. A package a rollout refers to cannot be deleted (RESTRICT).
CREATE TABLE firmware_packages (
    id            TEXT PRIMARY KEY,
    product_id    TEXT NOT NULL REFERENCES products (id) ON DELETE CASCADE,
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    size          BIGINT NOT NULL,
    sha256        TEXT NOT NULL,
    signature     TEXT NOT NULL DEFAULT '',
    release_notes TEXT NOT NULL DEFAULT '',
    file_name     TEXT NOT NULL,
    creator_id    TEXT NOT NULL DEFAULT '',
    create_time   TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (product_id, version)
);

-- A rollout brings its target devices to the package's version: target is
-- {"productId"} or {"deviceIds": [...]} or {"query": <query body>}, as
-- given; the devices it selected are firmware_devices' rows, fixed at
-- creation. At most one rollout of a product is running or paused.
CREATE TABLE firmware_rollouts (
    id                TEXT PRIMARY KEY,
    product_id        TEXT NOT NULL REFERENCES products (id) ON DELETE CASCADE,
    package_id        TEXT NOT NULL REFERENCES firmware_packages (id) ON DELETE RESTRICT,
    version           TEXT NOT NULL,
    target            JSONB NOT NULL,
    rate_per_minute   INT NOT NULL,
    ramp_initial_rate INT NOT NULL DEFAULT 0,
    ramp_minutes      INT NOT NULL DEFAULT 0,
    abort_percent     DOUBLE PRECISION NOT NULL DEFAULT 0,
    abort_min_started INT NOT NULL DEFAULT 0,
    timeout_seconds   INT NOT NULL,
    retries           INT NOT NULL DEFAULT 0,
    state             TEXT NOT NULL CHECK (state IN ('running', 'paused', 'canceled', 'aborted', 'completed')),
    reason            TEXT NOT NULL DEFAULT '',
    devices           INT NOT NULL DEFAULT 0,
    creator_id        TEXT NOT NULL DEFAULT '',
    create_time       TIMESTAMPTZ NOT NULL DEFAULT now(),
    update_time       TIMESTAMPTZ NOT NULL DEFAULT now(),
    end_time          TIMESTAMPTZ
);
CREATE UNIQUE INDEX firmware_rollouts_one_active ON firmware_rollouts (product_id) WHERE state IN ('running', 'paused');
CREATE INDEX firmware_rollouts_package ON firmware_rollouts (package_id);

-- A device's job in a rollout. state is QUEUED (not started), INITIATED
-- (upgrade sent), DOWNLOADING, DOWNLOADED, VERIFIED, UPDATING (what the
-- device reported), UPDATED (it reported the target version on
-- firmware/version), FAILED (reason), TIMED_OUT, CANCELED. reported is
-- the device's last progress state verbatim (its UPDATED is not trusted:
-- state stays UPDATING). first_start is when it was first started (the
-- pace counts it), start_time its last start, deadline when that start
-- times out; attempts counts starts.
CREATE TABLE firmware_devices (
    rollout_id  TEXT NOT NULL REFERENCES firmware_rollouts (id) ON DELETE CASCADE,
    device_id   TEXT NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
    state       TEXT NOT NULL DEFAULT 'QUEUED',
    reported    TEXT NOT NULL DEFAULT '',
    progress    INT NOT NULL DEFAULT 0,
    reason      TEXT NOT NULL DEFAULT '',
    attempts    INT NOT NULL DEFAULT 0,
    message_id  TEXT NOT NULL DEFAULT '',
    first_start TIMESTAMPTZ,
    start_time  TIMESTAMPTZ,
    deadline    TIMESTAMPTZ,
    update_time TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (rollout_id, device_id)
);
CREATE INDEX firmware_devices_device ON firmware_devices (device_id);
CREATE INDEX firmware_devices_state ON firmware_devices (rollout_id, state);
CREATE INDEX firmware_devices_deadline ON firmware_devices (deadline) WHERE deadline IS NOT NULL;

-- +goose Down
DROP TABLE firmware_devices;
DROP TABLE firmware_rollouts;
DROP TABLE firmware_packages;
