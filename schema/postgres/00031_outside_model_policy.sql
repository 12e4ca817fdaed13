-- +goose Up
-- What ingest does with a reported value outside the device's thing model
-- (an undeclared property, an enum value none of its elements has, a value
-- of another type): keep stores it (the API marks it when read), drop does
-- not store it. Either way ingest counts it
-- (devicehub_ingest_outside_model_values_total).
ALTER TABLE products ADD COLUMN outside_model_policy TEXT NOT NULL DEFAULT 'keep'
    CHECK (outside_model_policy IN ('keep', 'drop'));

-- +goose Down
ALTER TABLE products DROP COLUMN outside_model_policy;
