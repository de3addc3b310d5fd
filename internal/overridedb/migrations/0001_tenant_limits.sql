-- 0001: per-tenant limit overrides, their audit log, change tracking for
-- incremental refreshes, and NOTIFY so that every node reloads at once.
--
-- The shape of tenant_limits.limits, checked here so that a direct SQL edit
-- gets the same clear error as the CLI:
--   {"activity_create": {"limit": 200, "scale_ms": 1000}, ...}
-- Which buckets may be overridden is the server's configuration, not
-- known here: the CLI refuses others, nodes skip and count them.

-- NULL when limits has the right shape, else what is wrong with it.
CREATE OR REPLACE FUNCTION tenant_limits_problem(limits jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
	b text;
	v jsonb;
	k text;
BEGIN
	IF limits IS NULL OR jsonb_typeof(limits) <> 'object' THEN
		RETURN 'limits must be a JSON object of bucket name to {"limit": N, "scale_ms": MS}, not '
			|| coalesce(left(limits::text, 80), 'NULL');
	END IF;
	FOR b, v IN SELECT e.key, e.value FROM jsonb_each(limits) AS e LOOP
		IF b !~ '^[a-z][a-z0-9_]{0,62}$' THEN
			RETURN format('%s is not a bucket name (lowercase letters, digits and _, starting with a letter)', to_json(left(b, 80)));
		END IF;
		IF jsonb_typeof(v) <> 'object' THEN
			RETURN format('bucket %s: want {"limit": N, "scale_ms": MS}, not %s', b, left(v::text, 80));
		END IF;
		FOR k IN SELECT jsonb_object_keys(v) LOOP
			IF k NOT IN ('limit', 'scale_ms') THEN
				RETURN format('bucket %s: unknown field %s (want only "limit" and "scale_ms")', b, to_json(left(k, 80)));
			END IF;
		END LOOP;
		-- CASE, not OR: the cast must only see digits. (Parenthesised: a
		-- PL/pgSQL IF condition ends at the first THEN.)
		IF NOT (CASE WHEN jsonb_typeof(v -> 'limit') = 'number' AND (v ->> 'limit') ~ '^[0-9]{1,10}$'
			THEN (v ->> 'limit')::bigint BETWEEN 1 AND 2147483647 ELSE false END) THEN
			RETURN format('bucket %s: "limit" must be a whole number from 1 to 2147483647, not %s',
				b, coalesce(left((v -> 'limit')::text, 80), 'missing'));
		END IF;
		IF jsonb_typeof(v -> 'scale_ms') IS DISTINCT FROM 'number'
			OR (v ->> 'scale_ms') NOT IN ('1000', '60000', '3600000', '86400000') THEN
			RETURN format('bucket %s: "scale_ms" must be 1000 (1s), 60000 (1m), 3600000 (1h) or 86400000 (1d), not %s',
				b, coalesce(left((v -> 'scale_ms')::text, 80), 'missing'));
		END IF;
	END LOOP;
	RETURN NULL;
END
$$;

CREATE TABLE IF NOT EXISTS tenant_limits (
	tenant     text PRIMARY KEY
	           CONSTRAINT tenant_limits_tenant_valid
	           CHECK (octet_length(tenant) BETWEEN 1 AND 256 AND tenant !~ '[[:cntrl:]]'),
	-- Bucket name → {"limit": N, "scale_ms": MS}.
	limits     jsonb NOT NULL
	           CONSTRAINT tenant_limits_limits_shape
	           CHECK (tenant_limits_problem(limits) IS NULL),
	-- The transaction that last changed the row, set by a trigger: nodes
	-- refresh incrementally from the oldest transaction that was still
	-- running at their previous refresh, so a late commit is never missed.
	xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
	updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS tenant_limits_xid ON tenant_limits (xid);

-- Deleted tenants, for incremental refreshes; kept a day (a node that
-- missed more than that reloads everything).
CREATE TABLE IF NOT EXISTS tenant_limits_deletions (
	tenant     text PRIMARY KEY,
	xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
	deleted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS tenant_limits_deletions_xid ON tenant_limits_deletions (xid);
CREATE INDEX IF NOT EXISTS tenant_limits_deletions_deleted_at ON tenant_limits_deletions (deleted_at);

-- Every change, by the CLI or by plain SQL, in the same transaction.
-- actor: the CLI's --actor (the transaction setting ratelimit_authz.actor),
-- else "sql:" and the database user.
CREATE TABLE IF NOT EXISTS tenant_limits_audit (
	id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	tenant text NOT NULL,
	actor  text NOT NULL,
	old    jsonb,  -- NULL: the tenant had no row
	new    jsonb,  -- NULL: the row was deleted
	at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS tenant_limits_audit_tenant ON tenant_limits_audit (tenant, id);

-- BEFORE: explain a bad shape in words (the CHECK constraint stays as the
-- guard when triggers are bypassed), forbid renames, stamp the change.
CREATE OR REPLACE FUNCTION tenant_limits_before() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
	problem text := tenant_limits_problem(NEW.limits);
BEGIN
	IF problem IS NOT NULL THEN
		RAISE EXCEPTION 'tenant_limits: invalid limits for tenant %: %', to_json(NEW.tenant)::text, problem
			USING ERRCODE = 'check_violation',
			      HINT = 'the shape is {"activity_create": {"limit": 200, "scale_ms": 1000}}';
	END IF;
	IF TG_OP = 'UPDATE' AND NEW.tenant IS DISTINCT FROM OLD.tenant THEN
		RAISE EXCEPTION 'tenant_limits: a row''s tenant cannot change (% to %): delete it and insert a new one',
			to_json(OLD.tenant)::text, to_json(NEW.tenant)::text
			USING ERRCODE = 'check_violation';
	END IF;
	NEW.xid := pg_current_xact_id();
	NEW.updated_at := now();
	RETURN NEW;
END
$$;

-- AFTER each row: audit, and keep the deletions table in step.
CREATE OR REPLACE FUNCTION tenant_limits_after_row() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
	actor text := coalesce(nullif(current_setting('ratelimit_authz.actor', true), ''), 'sql:' || session_user);
BEGIN
	IF TG_OP = 'INSERT' THEN
		DELETE FROM tenant_limits_deletions WHERE tenant = NEW.tenant;
		INSERT INTO tenant_limits_audit (tenant, actor, old, new) VALUES (NEW.tenant, actor, NULL, NEW.limits);
	ELSIF TG_OP = 'UPDATE' THEN
		IF NEW.limits IS DISTINCT FROM OLD.limits THEN
			INSERT INTO tenant_limits_audit (tenant, actor, old, new) VALUES (NEW.tenant, actor, OLD.limits, NEW.limits);
		END IF;
	ELSE
		INSERT INTO tenant_limits_deletions (tenant) VALUES (OLD.tenant)
			ON CONFLICT (tenant) DO UPDATE SET xid = pg_current_xact_id(), deleted_at = now();
		INSERT INTO tenant_limits_audit (tenant, actor, old, new) VALUES (OLD.tenant, actor, OLD.limits, NULL);
	END IF;
	RETURN NULL;
END
$$;

-- AFTER each statement: one notification per change however many rows it
-- touched, and pruning of old deletions.
CREATE OR REPLACE FUNCTION tenant_limits_after_statement() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('ratelimit_authz_tenant_limits', '');
	IF TG_OP = 'DELETE' THEN
		DELETE FROM tenant_limits_deletions WHERE deleted_at < now() - interval '1 day';
	END IF;
	RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS tenant_limits_before ON tenant_limits;
CREATE TRIGGER tenant_limits_before BEFORE INSERT OR UPDATE ON tenant_limits
	FOR EACH ROW EXECUTE FUNCTION tenant_limits_before();
DROP TRIGGER IF EXISTS tenant_limits_after_row ON tenant_limits;
CREATE TRIGGER tenant_limits_after_row AFTER INSERT OR UPDATE OR DELETE ON tenant_limits
	FOR EACH ROW EXECUTE FUNCTION tenant_limits_after_row();
DROP TRIGGER IF EXISTS tenant_limits_after_statement ON tenant_limits;
CREATE TRIGGER tenant_limits_after_statement AFTER INSERT OR UPDATE OR DELETE ON tenant_limits
	FOR EACH STATEMENT EXECUTE FUNCTION tenant_limits_after_statement();

-- TRUNCATE deletes without row triggers: no audit, no deletion records, so
-- nodes could keep truncated overrides until their next full reload.
CREATE OR REPLACE FUNCTION tenant_limits_no_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'tenant_limits: TRUNCATE is refused (it bypasses the audit log and change tracking); use DELETE FROM tenant_limits'
		USING ERRCODE = 'feature_not_supported';
END
$$;
DROP TRIGGER IF EXISTS tenant_limits_no_truncate ON tenant_limits;
CREATE TRIGGER tenant_limits_no_truncate BEFORE TRUNCATE ON tenant_limits
	FOR EACH STATEMENT EXECUTE FUNCTION tenant_limits_no_truncate();
