-- +goose Up
-- Notifications (ingest/notify). A channel is where a notification goes
-- (a webhook, an SMTP mailbox, another MQTT broker); config is its
-- settings as the API reads and writes them, secret apart (never read
-- back through the API).
CREATE TABLE notify_channels (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('webhook', 'email', 'mqtt')),
    config      JSONB NOT NULL,
    secret      TEXT NOT NULL DEFAULT '',
    creator_id  TEXT NOT NULL DEFAULT '',
    modifier_id TEXT NOT NULL DEFAULT '',
    create_time TIMESTAMPTZ NOT NULL DEFAULT now(),
    modify_time TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A subscription: which alarms (products; rules, none meaning all; the
-- lowest severity as a rank, info 1 .. critical 5), which transition kinds,
-- and the escalation chain: channels[1] hears the transitions; channels[i+1]
-- hears an alarm still active and unacknowledged escalate_ms[i] after it
-- was raised. remind_ms: a reminder every so long while active and
-- unacknowledged (0: none), to the chain's channel reached by then.
-- quiet_ms: at most one transition notification per (rule, device) per so
-- long (0: no limit).
CREATE TABLE notify_subscriptions (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    products     TEXT[] NOT NULL,
    rules        TEXT[] NOT NULL DEFAULT '{}',
    min_severity INT NOT NULL DEFAULT 1,
    kinds        TEXT[] NOT NULL,
    channels     TEXT[] NOT NULL,
    escalate_ms  BIGINT[] NOT NULL DEFAULT '{}',
    remind_ms    BIGINT NOT NULL DEFAULT 0,
    quiet_ms     BIGINT NOT NULL DEFAULT 0,
    enabled      BOOLEAN NOT NULL DEFAULT true,
    creator_id   TEXT NOT NULL DEFAULT '',
    modifier_id  TEXT NOT NULL DEFAULT '',
    create_time  TIMESTAMPTZ NOT NULL DEFAULT now(),
    modify_time  TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (cardinality(channels) >= 1 AND cardinality(escalate_ms) = cardinality(channels) - 1)
);
CREATE INDEX notify_subscriptions_products ON notify_subscriptions USING GIN (products);

-- The outbox: one row per notification to send. Written by the trigger
-- below in the transaction of the alarm transition that causes it, or by
-- the scheduler (escalations, reminders). step names what caused it
-- ('t<transition id>', 'e<level>', 'r<n>'): (record, subscription, step)
-- is unique, so no cause is enqueued twice whoever writes it and however
-- often. The row's id is the idempotency key receivers see.
CREATE TABLE notify_outbox (
    id              BIGSERIAL PRIMARY KEY,
    record_id       BIGINT NOT NULL,
    subscription_id TEXT NOT NULL,
    channel_id      TEXT NOT NULL,
    step            TEXT NOT NULL,
    kind            TEXT NOT NULL,
    payload         JSONB NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts        INT NOT NULL DEFAULT 0,
    due_time        TIMESTAMPTZ NOT NULL DEFAULT now(),
    create_time     TIMESTAMPTZ NOT NULL DEFAULT now(),
    done_time       TIMESTAMPTZ,
    last_error      TEXT NOT NULL DEFAULT '',
    UNIQUE (record_id, subscription_id, step)
);
CREATE INDEX notify_outbox_due ON notify_outbox (due_time, id) WHERE state = 'pending';
CREATE INDEX notify_outbox_order ON notify_outbox (record_id, channel_id, id) WHERE state = 'pending';
CREATE INDEX notify_outbox_dead ON notify_outbox (done_time DESC, id DESC) WHERE state = 'dead';
CREATE INDEX notify_outbox_done ON notify_outbox (done_time) WHERE state = 'delivered';

-- Since when (the server's clock, not the device's) an alarm concerns a
-- subscription that escalates or reminds: written by the trigger at the
-- first transition of the alarm the subscription matches; the
-- scheduler's escalations and reminders count from it, and only alarms
-- raised while the subscription existed have one. Deleted by the
-- scheduler once the alarm is cleared or acknowledged.
CREATE TABLE notify_active (
    record_id       BIGINT NOT NULL,
    subscription_id TEXT NOT NULL,
    since           TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (record_id, subscription_id)
);

-- The quiet rule's memory: when (subscription, rule, device) last had a
-- transition notification enqueued, by the server's clock (a device's
-- clock set back would otherwise silence it). Keyed by rule and device, not by
-- record, so an alarm cleared and raised again within the quiet time
-- counts as one.
CREATE TABLE notify_quiet (
    subscription_id TEXT NOT NULL,
    rule_id         TEXT NOT NULL,
    device_id       TEXT NOT NULL,
    last_time       TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (subscription_id, rule_id, device_id)
);

-- +goose StatementBegin
CREATE FUNCTION notify_severity_rank(s TEXT) RETURNS INT LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE s WHEN 'critical' THEN 5 WHEN 'major' THEN 4 WHEN 'minor' THEN 3
                  WHEN 'warning' THEN 2 WHEN 'info' THEN 1 ELSE 0 END
$$;
-- +goose StatementEnd

-- notify_payload is what a notification tells of an alarm: the record as
-- it is now and the cause (a transition's kind, severity, value, user and
-- comment; or an escalation or a reminder).
-- +goose StatementBegin
CREATE FUNCTION notify_payload(r alarm_records, kind TEXT, severity TEXT, t alarm_transitions) RETURNS JSONB LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'recordId', r.id, 'ruleId', r.rule_id, 'ruleName', r.rule_name, 'productId', r.product_id,
        'deviceId', r.device_id, 'state', r.state, 'severity', severity, 'count', r.count,
        'firstValue', r.first_value, 'lastValue', r.last_value,
        'raisedTime', (extract(epoch FROM r.raised_time) * 1000)::BIGINT,
        'lastTime', (extract(epoch FROM r.last_time) * 1000)::BIGINT,
        'acked', r.acked, 'kind', kind,
        'transitionId', t.id, 'time', (extract(epoch FROM coalesce(t.time, now())) * 1000)::BIGINT,
        'value', coalesce(t.value, ''), 'username', coalesce(t.username, ''), 'comment', coalesce(t.comment, ''))
$$;
-- +goose StatementEnd

-- The outbox's writer: in the transaction that inserts an alarm
-- transition, one row per matching subscription, unless its quiet time
-- holds the (rule, device).
-- +goose StatementBegin
CREATE FUNCTION notify_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r alarm_records;
    s notify_subscriptions;
    n INT;
BEGIN
    SELECT * INTO r FROM alarm_records WHERE id = NEW.record_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    FOR s IN SELECT * FROM notify_subscriptions
        WHERE enabled AND products @> ARRAY[r.product_id] -- the GIN index
          AND (cardinality(rules) = 0 OR r.rule_id = ANY(rules))
          AND notify_severity_rank(NEW.severity) >= min_severity
        ORDER BY id
    LOOP
        IF r.state = 'active' AND NOT r.acked AND (cardinality(s.escalate_ms) > 0 OR s.remind_ms > 0) THEN
            INSERT INTO notify_active (record_id, subscription_id) VALUES (r.id, s.id) ON CONFLICT DO NOTHING;
        END IF;
        CONTINUE WHEN NOT (NEW.kind = ANY(s.kinds));
        IF s.quiet_ms > 0 THEN
            INSERT INTO notify_quiet AS q (subscription_id, rule_id, device_id, last_time)
            VALUES (s.id, r.rule_id, r.device_id, now())
            ON CONFLICT (subscription_id, rule_id, device_id) DO UPDATE SET last_time = EXCLUDED.last_time
            WHERE q.last_time <= EXCLUDED.last_time - make_interval(secs => s.quiet_ms / 1000.0);
            GET DIAGNOSTICS n = ROW_COUNT;
            CONTINUE WHEN n = 0;
        END IF;
        INSERT INTO notify_outbox (record_id, subscription_id, channel_id, step, kind, payload)
        VALUES (r.id, s.id, s.channels[1], 't' || NEW.id, NEW.kind, notify_payload(r, NEW.kind, NEW.severity, NEW))
        ON CONFLICT (record_id, subscription_id, step) DO NOTHING;
        -- Wakes the dispatchers at commit (PostgreSQL sends one per
        -- transaction however many rows); their poll is the fallback.
        PERFORM pg_notify('devicehub_notify', '');
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER notify_enqueue AFTER INSERT ON alarm_transitions FOR EACH ROW EXECUTE FUNCTION notify_enqueue();

-- +goose Down
DROP TRIGGER notify_enqueue ON alarm_transitions;
DROP FUNCTION notify_enqueue();
DROP FUNCTION notify_payload(alarm_records, TEXT, TEXT, alarm_transitions);
DROP FUNCTION notify_severity_rank(TEXT);
DROP TABLE notify_quiet;
DROP TABLE notify_active;
DROP TABLE notify_outbox;
DROP TABLE notify_subscriptions;
DROP TABLE notify_channels;
