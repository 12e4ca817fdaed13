-- +goose Up
-- The audit trail (meta/audit.go, api/audit.go): one row per write
-- through the API (every request that is not a read, api/audit.go says
-- which) and per login attempt, successful or not. username is the
-- name at the time (a deleted user's rows keep it), or the name a
-- failed login tried; user_id is '' when no user was known. route is
-- the route's pattern (/api/device/instance/:id), object_id its path
-- parameter (the object written), status and code the answer's HTTP
-- status and envelope code ('' on success). Rows older than the
-- configured retention are deleted (-audit-retention).
CREATE TABLE audit (
    id        BIGSERIAL PRIMARY KEY,
    time      TIMESTAMPTZ NOT NULL,
    user_id   TEXT NOT NULL DEFAULT '',
    username  TEXT NOT NULL DEFAULT '',
    address   TEXT NOT NULL DEFAULT '',
    method    TEXT NOT NULL,
    route     TEXT NOT NULL,
    object_id TEXT NOT NULL DEFAULT '',
    status    INT NOT NULL,
    code      TEXT NOT NULL DEFAULT ''
);
-- The list's default order (newest first), its time ranges and the
-- retention sweep; the user and object terms.
CREATE INDEX audit_time ON audit (time DESC, id DESC);
CREATE INDEX audit_user ON audit (user_id, time DESC);
CREATE INDEX audit_object ON audit (object_id, time DESC);

-- +goose Down
DROP TABLE audit;
