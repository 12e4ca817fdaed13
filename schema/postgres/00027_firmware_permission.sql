-- +goose Up
-- firmware:write (packages and rollouts, ingest/firmware) is granted by
-- the built-in admin role, as every permission is.
INSERT INTO role_permissions (role_id, permission) VALUES ('admin', 'firmware:write') ON CONFLICT DO NOTHING;

-- +goose Down
DELETE FROM role_permissions WHERE permission = 'firmware:write';
