-- 0002: key owners. A bucket keyed by something other than the tenant (a
-- channel, from the path) takes the override of the tenant that owns the
-- key, as recorded here by an operator; never from a request header.
--
--   key_name  'channel' for a path:channel key, 'header:x-name' for a
--             header key (the key's name as the configuration writes it,
--             without "path:")
--   key_value the key exactly as the request carries it (a raw path
--             segment, or the header value)
--   tenant    whose overrides apply to the key
--
-- Change tracking, audit and NOTIFY work as for tenant_limits.

CREATE TABLE IF NOT EXISTS tenant_key_owners (
	key_name   text NOT NULL
	           CONSTRAINT tenant_key_owners_key_name_valid
	           CHECK (key_name ~ '^([A-Za-z_][A-Za-z0-9_]{0,63}|header:[!#$%&''*+.^_`|~0-9a-z-]{1,120})$'),
	key_value  text NOT NULL
	           CONSTRAINT tenant_key_owners_key_value_valid
	           CHECK (octet_length(key_value) BETWEEN 1 AND 1024 AND key_value !~ '[[:cntrl:]]'),
	tenant     text NOT NULL
	           CONSTRAINT tenant_key_owners_tenant_valid
	           CHECK (octet_length(tenant) BETWEEN 1 AND 256 AND tenant !~ '[[:cntrl:]]'),
	xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (key_name, key_value)
);
CREATE INDEX IF NOT EXISTS tenant_key_owners_xid ON tenant_key_owners (xid);
CREATE INDEX IF NOT EXISTS tenant_key_owners_tenant ON tenant_key_owners (tenant);

CREATE TABLE IF NOT EXISTS tenant_key_owners_deletions (
	key_name   text NOT NULL,
	key_value  text NOT NULL,
	xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
	deleted_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (key_name, key_value)
);
CREATE INDEX IF NOT EXISTS tenant_key_owners_deletions_xid ON tenant_key_owners_deletions (xid);
CREATE INDEX IF NOT EXISTS tenant_key_owners_deletions_deleted_at ON tenant_key_owners_deletions (deleted_at);

CREATE TABLE IF NOT EXISTS tenant_key_owners_audit (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	key_name   text NOT NULL,
	key_value  text NOT NULL,
	actor      text NOT NULL,
	old_tenant text,  -- NULL: the key had no owner
	new_tenant text,  -- NULL: the owner was removed
	at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS tenant_key_owners_audit_key ON tenant_key_owners_audit (key_name, key_value, id);

CREATE OR REPLACE FUNCTION tenant_key_owners_before() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'UPDATE' AND (NEW.key_name, NEW.key_value) IS DISTINCT FROM (OLD.key_name, OLD.key_value) THEN
		RAISE EXCEPTION 'tenant_key_owners: a row''s key cannot change: delete it and insert a new one'
			USING ERRCODE = 'check_violation';
	END IF;
	NEW.xid := pg_current_xact_id();
	NEW.updated_at := now();
	RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION tenant_key_owners_after_row() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
	actor text := coalesce(nullif(current_setting('ratelimit_authz.actor', true), ''), 'sql:' || session_user);
BEGIN
	IF TG_OP = 'INSERT' THEN
		DELETE FROM tenant_key_owners_deletions WHERE key_name = NEW.key_name AND key_value = NEW.key_value;
		INSERT INTO tenant_key_owners_audit (key_name, key_value, actor, old_tenant, new_tenant)
			VALUES (NEW.key_name, NEW.key_value, actor, NULL, NEW.tenant);
	ELSIF TG_OP = 'UPDATE' THEN
		IF NEW.tenant IS DISTINCT FROM OLD.tenant THEN
			INSERT INTO tenant_key_owners_audit (key_name, key_value, actor, old_tenant, new_tenant)
				VALUES (NEW.key_name, NEW.key_value, actor, OLD.tenant, NEW.tenant);
		END IF;
	ELSE
		INSERT INTO tenant_key_owners_deletions (key_name, key_value) VALUES (OLD.key_name, OLD.key_value)
			ON CONFLICT (key_name, key_value) DO UPDATE SET xid = pg_current_xact_id(), deleted_at = now();
		INSERT INTO tenant_key_owners_audit (key_name, key_value, actor, old_tenant, new_tenant)
			VALUES (OLD.key_name, OLD.key_value, actor, OLD.tenant, NULL);
	END IF;
	RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION tenant_key_owners_after_statement() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('ratelimit_authz_tenant_limits', '');
	IF TG_OP = 'DELETE' THEN
		DELETE FROM tenant_key_owners_deletions WHERE deleted_at < now() - interval '1 day';
	END IF;
	RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS tenant_key_owners_before ON tenant_key_owners;
CREATE TRIGGER tenant_key_owners_before BEFORE INSERT OR UPDATE ON tenant_key_owners
	FOR EACH ROW EXECUTE FUNCTION tenant_key_owners_before();
DROP TRIGGER IF EXISTS tenant_key_owners_after_row ON tenant_key_owners;
CREATE TRIGGER tenant_key_owners_after_row AFTER INSERT OR UPDATE OR DELETE ON tenant_key_owners
	FOR EACH ROW EXECUTE FUNCTION tenant_key_owners_after_row();
DROP TRIGGER IF EXISTS tenant_key_owners_after_statement ON tenant_key_owners;
CREATE TRIGGER tenant_key_owners_after_statement AFTER INSERT OR UPDATE OR DELETE ON tenant_key_owners
	FOR EACH STATEMENT EXECUTE FUNCTION tenant_key_owners_after_statement();

CREATE OR REPLACE FUNCTION tenant_key_owners_no_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'tenant_key_owners: TRUNCATE is refused (it bypasses the audit log and change tracking); use DELETE FROM tenant_key_owners'
		USING ERRCODE = 'feature_not_supported';
END
$$;
DROP TRIGGER IF EXISTS tenant_key_owners_no_truncate ON tenant_key_owners;
CREATE TRIGGER tenant_key_owners_no_truncate BEFORE TRUNCATE ON tenant_key_owners
	FOR EACH STATEMENT EXECUTE FUNCTION tenant_key_owners_no_truncate();
