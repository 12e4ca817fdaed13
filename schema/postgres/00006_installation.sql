-- +goose Up
-- One id per devicehub database: what devicehub writes into a broker it
-- may share with other deployments (its device logins) carries it, so
-- that each deployment keeps its own and leaves the others' alone.
CREATE TABLE installation (
    id TEXT PRIMARY KEY
);
INSERT INTO installation (id) VALUES (substr(replace(gen_random_uuid()::text, '-', ''), 1, 12));

-- +goose Down
DROP TABLE installation;
