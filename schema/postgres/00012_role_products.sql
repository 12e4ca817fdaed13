-- +goose Up
-- A role grants its permissions (role_permissions) either on every
-- product (roles.all_products, the default: the built-in roles and every
-- role made before) or only on the products listed in role_products, and
-- their devices. A user's grant of a permission is the union over its
-- enabled roles: on every product if one of them grants it so, else on
-- the union of their products (meta/roles.go, meta.User.Scope).
--
-- A table rather than an array column: a product's deletion removes it
-- from every role (the foreign key's cascade), so that a product made
-- later under the same id is not granted to anyone by a stale entry; and
-- the product's rows are found by its index. The flag on roles, rather
-- than "no rows means every product", keeps a role whose products were
-- all deleted limited (to none) instead of widening it to everything.
ALTER TABLE roles ADD COLUMN all_products BOOLEAN NOT NULL DEFAULT true;

CREATE TABLE role_products (
    role_id    TEXT NOT NULL REFERENCES roles (id) ON DELETE CASCADE,
    product_id TEXT NOT NULL REFERENCES products (id) ON DELETE CASCADE,
    PRIMARY KEY (role_id, product_id)
);
CREATE INDEX role_products_product_id ON role_products (product_id);

-- A change of a role's products is announced like a change of its
-- permissions (00011): the tokens of the users holding it are read again
-- on every instance, and their live streams end. A product's deletion
-- removes its rows here, and is announced so too.
CREATE TRIGGER role_products_added AFTER INSERT ON role_products REFERENCING NEW TABLE AS added
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_role_grants_changed();
CREATE TRIGGER role_products_removed AFTER DELETE ON role_products REFERENCING OLD TABLE AS gone
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_role_grants_changed();
CREATE TRIGGER role_products_updated AFTER UPDATE ON role_products REFERENCING OLD TABLE AS gone NEW TABLE AS added
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_role_grants_changed();
CREATE TRIGGER roles_all_products_changed AFTER UPDATE OF all_products ON roles FOR EACH ROW
	WHEN (OLD.all_products IS DISTINCT FROM NEW.all_products)
	EXECUTE FUNCTION devicehub_role_state_changed();

-- +goose Down
DROP TRIGGER roles_all_products_changed ON roles;
DROP TRIGGER role_products_updated ON role_products;
DROP TRIGGER role_products_removed ON role_products;
DROP TRIGGER role_products_added ON role_products;
DROP TABLE role_products;
ALTER TABLE roles DROP COLUMN all_products;
