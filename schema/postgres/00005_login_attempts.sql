-- +goose Up
-- Failed logins are counted per client address and username, not per
-- account: failures from one address lock that address out of the
-- account and no one else. The username is kept as typed, whether or not
-- an account has it, so that unknown accounts are limited like real ones
-- and the answers do not tell them apart.
CREATE TABLE login_attempts (
    address      TEXT        NOT NULL,
    username     TEXT        NOT NULL,
    -- attempts since the last success or the last expired lock, those
    -- still being checked included
    failures     INTEGER     NOT NULL,
    locked_until TIMESTAMPTZ,
    last_attempt TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (address, username)
);
-- Rows idle for longer than the lockout are swept by last_attempt.
CREATE INDEX login_attempts_last_attempt ON login_attempts (last_attempt);
-- The per-account counters of 00003 are replaced by this table.
ALTER TABLE users DROP COLUMN locked_until;
ALTER TABLE users DROP COLUMN failed_logins;

-- +goose Down
ALTER TABLE users ADD COLUMN failed_logins INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN locked_until TIMESTAMPTZ;
DROP TABLE login_attempts;
