package meta

import (
	"context"
	"time"
)

// Role is a named permission group (spec: Role).
type Role struct {
	ID          string `db:"id" json:"id"`
	Name        string `db:"name" json:"name"`
	Description string `db:"description" json:"description"`
	State       Enum   `db:"state" json:"state"`
	CreatorID   string `db:"creator_id" json:"creatorId"`
	CreateTime  Millis `db:"-" json:"createTime"`
}

type roleRow struct {
	Role
	CreatedAt time.Time `db:"create_time"`
}

func (r *roleRow) role() Role {
	role := r.Role
	role.CreateTime = Millis(r.CreatedAt)
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
	return queryPage(ctx, s, RoleResource, q, "r.id, r.name, r.description, r.state, r.creator_id, r.create_time", "roles r", (*roleRow).role)
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
