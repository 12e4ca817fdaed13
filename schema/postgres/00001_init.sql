-- +goose Up
-- Times are timestamptz; the API speaks epoch milliseconds.
CREATE TABLE roles (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    state       TEXT NOT NULL DEFAULT 'enabled',
    creator_id  TEXT NOT NULL DEFAULT '',
    create_time TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX roles_create_time ON roles (create_time DESC, id);

CREATE TABLE users (
    id            TEXT PRIMARY KEY,
    username      TEXT NOT NULL UNIQUE,
    name          TEXT NOT NULL DEFAULT '',
    password_hash TEXT NOT NULL,
    state         TEXT NOT NULL DEFAULT 'enabled',
    create_time   TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE user_roles (
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role_id TEXT NOT NULL REFERENCES roles (id) ON DELETE CASCADE,
    PRIMARY KEY (user_id, role_id)
);

-- Access tokens are stored as SHA-256 hashes; the token itself is only ever
-- in the login response. Lifetimes slide: each use pushes expires_at.
CREATE TABLE tokens (
    hash        BYTEA PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    lifetime_ms BIGINT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    create_time TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX tokens_expires_at ON tokens (expires_at);

CREATE TABLE products (
    id                    TEXT PRIMARY KEY,
    name                  TEXT NOT NULL,
    photo_url             TEXT NOT NULL DEFAULT '',
    classified_id         TEXT NOT NULL DEFAULT '',
    classified_name       TEXT NOT NULL DEFAULT '',
    classified_id_arr     TEXT[] NOT NULL DEFAULT '{}',
    message_protocol      TEXT NOT NULL DEFAULT '',
    protocol_name         TEXT NOT NULL DEFAULT '',
    metadata              TEXT NOT NULL DEFAULT '{"properties":[],"events":[],"functions":[],"tags":[]}',
    transport_protocol    TEXT NOT NULL DEFAULT '',
    device_type           TEXT NOT NULL,
    secure_id             TEXT NOT NULL DEFAULT '',
    secure_key            TEXT NOT NULL DEFAULT '',
    state                 SMALLINT NOT NULL DEFAULT 0,
    creator_id            TEXT NOT NULL DEFAULT '',
    modifier_id           TEXT NOT NULL DEFAULT '',
    create_time           TIMESTAMPTZ NOT NULL DEFAULT now(),
    modify_time           TIMESTAMPTZ NOT NULL DEFAULT now(),
    regulator             BOOLEAN NOT NULL DEFAULT false,
    access_id             TEXT NOT NULL DEFAULT '',
    access_provider       TEXT NOT NULL DEFAULT '',
    access_name           TEXT NOT NULL DEFAULT '',
    store_policy          TEXT NOT NULL DEFAULT '',
    org_id                TEXT NOT NULL DEFAULT '',
    super_product_type    TEXT NOT NULL DEFAULT 'commonProduct',
    virtual_type          TEXT NOT NULL DEFAULT 'real',
    product_create_type   TEXT NOT NULL DEFAULT 'manual',
    preset_type           TEXT NOT NULL DEFAULT 'none',
    three_dimensional_url TEXT NOT NULL DEFAULT '',
    model_from            TEXT NOT NULL DEFAULT '',
    manufacturer          TEXT NOT NULL DEFAULT '',
    describe              TEXT NOT NULL DEFAULT '',
    model                 TEXT NOT NULL DEFAULT ''
);
CREATE INDEX products_create_time ON products (create_time DESC, id);

CREATE TABLE devices (
    id                 TEXT PRIMARY KEY,
    name               TEXT NOT NULL,
    photo_url          TEXT NOT NULL DEFAULT '',
    product_id         TEXT NOT NULL REFERENCES products (id),
    state              TEXT NOT NULL DEFAULT 'notActive',
    description        TEXT NOT NULL DEFAULT '',
    super_device_type  TEXT NOT NULL DEFAULT 'normalDevice',
    edge               BOOLEAN NOT NULL DEFAULT false,
    media_device       BOOLEAN NOT NULL DEFAULT false,
    features           JSONB NOT NULL DEFAULT '[]',
    virtual_type       TEXT NOT NULL DEFAULT 'real',
    come_from          TEXT NOT NULL DEFAULT 'cloud',
    device_create_type TEXT NOT NULL DEFAULT 'fromProduct',
    preset_type        TEXT NOT NULL DEFAULT 'none',
    category_type      TEXT NOT NULL DEFAULT 'none',
    -- NULL: the product's thing model is in force; else the device's own.
    metadata           TEXT,
    secure_id          TEXT NOT NULL DEFAULT '',
    secure_key         TEXT NOT NULL DEFAULT '',
    channel_id         TEXT NOT NULL DEFAULT '',
    configuration      JSONB NOT NULL DEFAULT '{}',
    tags               JSONB NOT NULL DEFAULT '[]',
    binds              JSONB NOT NULL DEFAULT '[]',
    relations          JSONB NOT NULL DEFAULT '[]',
    org_id             TEXT NOT NULL DEFAULT '',
    store_policy       TEXT NOT NULL DEFAULT '',
    address            TEXT NOT NULL DEFAULT '',
    connect_server_id  TEXT NOT NULL DEFAULT '',
    creator_id         TEXT NOT NULL DEFAULT '',
    creator_name       TEXT NOT NULL DEFAULT '',
    modifier_id        TEXT NOT NULL DEFAULT '',
    modifier_name      TEXT NOT NULL DEFAULT '',
    create_time        TIMESTAMPTZ NOT NULL DEFAULT now(),
    modify_time        TIMESTAMPTZ NOT NULL DEFAULT now(),
    registry_time      TIMESTAMPTZ,
    online_time        TIMESTAMPTZ,
    offline_time       TIMESTAMPTZ
);
CREATE INDEX devices_product_id ON devices (product_id);
CREATE INDEX devices_state ON devices (state);
CREATE INDEX devices_create_time ON devices (create_time DESC, id);

-- +goose Down
DROP TABLE devices;
DROP TABLE products;
DROP TABLE tokens;
DROP TABLE user_roles;
DROP TABLE users;
DROP TABLE roles;
