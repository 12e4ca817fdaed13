-- +goose Up
-- Repeated failed logins in the audit trail (00013; meta/audit.go): a
-- flood of them must not write a row each. Attempts that repeat one
-- another (same client address, name tried, route, method, status and
-- code) within one window (window_start, the minute of their time) are
-- one row: count is how many, first_time the first one's time and time
-- the last one's. Other rows are one request each (count 1, first_time
-- and window_start NULL). The unique index is what the upsert of
-- InsertAudit meets; rows without a window never conflict.
ALTER TABLE audit
    ADD COLUMN count        INT NOT NULL DEFAULT 1,
    ADD COLUMN first_time   TIMESTAMPTZ,
    ADD COLUMN window_start TIMESTAMPTZ;
CREATE UNIQUE INDEX audit_repeats ON audit (window_start, address, username, method, route, status, code)
    WHERE window_start IS NOT NULL;

-- +goose Down
DROP INDEX audit_repeats;
ALTER TABLE audit DROP COLUMN window_start, DROP COLUMN first_time, DROP COLUMN count;
