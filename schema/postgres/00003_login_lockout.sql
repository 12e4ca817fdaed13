-- +goose Up
-- Per-user login lockout: after too many failures in a row the account is
-- locked for a while (kept in the database so every instance agrees).
ALTER TABLE users ADD COLUMN failed_logins INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN locked_until TIMESTAMPTZ;

-- +goose Down
ALTER TABLE users DROP COLUMN locked_until;
ALTER TABLE users DROP COLUMN failed_logins;
