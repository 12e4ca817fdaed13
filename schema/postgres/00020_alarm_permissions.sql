-- +goose Up
-- The alarm permissions (meta/roles.go): admin holds them all; an
-- operator reads alarms and handles them (acknowledge, clear); a viewer
-- reads them. Writing rules (rule:write) is the admin's until a role
-- grants it.
INSERT INTO role_permissions (role_id, permission)
SELECT r, p FROM (VALUES
    ('admin', 'alarm:read'), ('admin', 'alarm:write'), ('admin', 'rule:write'),
    ('operator', 'alarm:read'), ('operator', 'alarm:write'),
    ('viewer', 'alarm:read')
) AS g (r, p)
WHERE EXISTS (SELECT 1 FROM roles WHERE id = g.r)
ON CONFLICT DO NOTHING;

-- +goose Down
DELETE FROM role_permissions WHERE permission IN ('alarm:read', 'alarm:write', 'rule:write');
