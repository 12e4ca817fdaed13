package meta

import (
	"context"
	"encoding/json"
	"time"

	"github.com/lib/pq"
)

// Permission is a right, resource:action: what a route needs (api/routes.go
// declares one beside each route) and what a role grants.
type Permission string

// The permissions, a small fixed set. A role grants each on every product
// (a role's product list is the next step: role_permissions gets a
// products column). Adding one: here, in Permissions, in the admin role's
// grants (schema/postgres, a new migration) and in api/openapi.
const (
	PermProductRead   Permission = "product:read"   // products: list, count, detail
	PermProductWrite  Permission = "product:write"  // products: create, change, delete, deploy
	PermDeviceRead    Permission = "device:read"    // devices: list, detail; live updates
	PermDeviceWrite   Permission = "device:write"   // devices: create, change, delete, deploy, thing model
	PermDeviceCommand Permission = "device:command" // property reads, function invokes
	PermDeviceSecret  Permission = "device:secret"  // a device's secureKey: rotation, and the generated one at creation
	PermDashboardRead Permission = "dashboard:read" // dashboard queries and exports
	PermUserAdmin     Permission = "user:admin"     // users and their roles
)

// Permissions lists every permission, in the order above.
var Permissions = []Permission{PermProductRead, PermProductWrite, PermDeviceRead, PermDeviceWrite,
	PermDeviceCommand, PermDeviceSecret, PermDashboardRead, PermUserAdmin}

var permissionText = map[Permission]string{
	PermProductRead:   "Read products",
	PermProductWrite:  "Write products",
	PermDeviceRead:    "Read devices",
	PermDeviceWrite:   "Write devices",
	PermDeviceCommand: "Command devices",
	PermDeviceSecret:  "Device secrets",
	PermDashboardRead: "Read dashboards",
	PermUserAdmin:     "Administer users",
}

// MarshalJSON writes the spec's EnumObject {text, value}.
func (p Permission) MarshalJSON() ([]byte, error) {
	text, ok := permissionText[p]
	if !ok {
		text = string(p)
	}
	return json.Marshal(struct {
		Text  string `json:"text"`
		Value string `json:"value"`
	}{text, string(p)})
}

// The built-in roles (schema/postgres/00011_role_permissions.sql): admin
// holds every permission, operator runs devices (no users, no device
// secrets), viewer reads.
const (
	RoleAdmin    = "admin"
	RoleOperator = "operator"
	RoleViewer   = "viewer"
)

// Role is a named permission group (spec: Role), with the permissions it
// grants.
type Role struct {
	ID          string       `db:"id" json:"id"`
	Name        string       `db:"name" json:"name"`
	Description string       `db:"description" json:"description"`
	State       Enum         `db:"state" json:"state"`
	CreatorID   string       `db:"creator_id" json:"creatorId"`
	CreateTime  Millis       `db:"-" json:"createTime"`
	Permissions []Permission `db:"-" json:"permissions"`
}

type roleRow struct {
	Role
	CreatedAt time.Time      `db:"create_time"`
	Perms     pq.StringArray `db:"permissions"`
}

func (r *roleRow) role() Role {
	role := r.Role
	role.CreateTime = Millis(r.CreatedAt)
	role.Permissions = make([]Permission, len(r.Perms))
	for i, p := range r.Perms {
		role.Permissions[i] = Permission(p)
	}
	return role
}

// RoleResource allows the spec's sort names id, name, description and
// createTime.
var RoleResource = &Resource{
	Name: "role",
	Columns: map[string]Column{
		"id":          {Expr: "r.id", Kind: KindText},
		"name":        {Expr: "r.name", Kind: KindText},
		"description": {Expr: "r.description", Kind: KindText},
		"state":       {Expr: "r.state", Kind: KindText},
		"creatorId":   {Expr: "r.creator_id", Kind: KindText},
		"createTime":  {Expr: "r.create_time", Kind: KindTime},
	},
	Sorts: map[string]string{
		"id":          "r.id",
		"name":        "r.name",
		"description": "r.description",
		"createTime":  "r.create_time",
	},
	DefaultSort: "r.create_time DESC, r.id",
	TieBreak:    "r.id",
}

// QueryRoles answers endpoint 13.
func (s *Store) QueryRoles(ctx context.Context, q *Query) (Page[Role], error) {
	return queryPage(ctx, s, RoleResource, q, "r.id, r.name, r.description, r.state, r.creator_id, r.create_time, "+
		"ARRAY(SELECT p.permission FROM role_permissions p WHERE p.role_id = r.id ORDER BY p.permission) AS permissions", "roles r", (*roleRow).role)
}

// CreateRole adds a role (administration and tests; the spec lists roles only).
func (s *Store) CreateRole(ctx context.Context, r Role) error {
	if err := checkID("id", r.ID); err != nil {
		return err
	}
	if err := checkText("name", r.Name, 128, true); err != nil {
		return err
	}
	if r.State == "" {
		r.State = "enabled"
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	_, err := s.db.ExecContext(ctx, `INSERT INTO roles (id, name, description, state, creator_id) VALUES ($1, $2, $3, $4, $5)`,
		r.ID, r.Name, r.Description, string(r.State), r.CreatorID)
	if isUniqueViolation(err) {
		return ErrDuplicateKey
	}
	return err
}
