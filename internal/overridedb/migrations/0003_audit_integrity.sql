-- 0003: audit integrity.
--
-- 1. Every audit row records the database user that made the change
--    (session_user: who logged in; current_user: the role in effect, after
--    SET ROLE) next to the claimed actor, which any session can set. A
--    BEFORE INSERT trigger on the audit tables stamps them, so a row
--    inserted by hand cannot claim another user either. Rows written before
--    this migration have NULL there: unknown.
-- 2. The trigger and check functions run with a fixed search_path: this
--    schema after pg_catalog, and pg_temp last. Without it a session could
--    create a temporary table named tenant_limits_audit (pg_temp is
--    searched first for tables by default) and the audit row of its next
--    change would go there, vanishing with the session.

ALTER TABLE tenant_limits_audit ADD COLUMN IF NOT EXISTS db_user text;
ALTER TABLE tenant_limits_audit ADD COLUMN IF NOT EXISTS db_role text;
ALTER TABLE tenant_key_owners_audit ADD COLUMN IF NOT EXISTS db_user text;
ALTER TABLE tenant_key_owners_audit ADD COLUMN IF NOT EXISTS db_role text;

CREATE OR REPLACE FUNCTION ratelimit_authz_audit_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	NEW.db_user := session_user;
	NEW.db_role := current_user;
	RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS tenant_limits_audit_stamp ON tenant_limits_audit;
CREATE TRIGGER tenant_limits_audit_stamp BEFORE INSERT OR UPDATE ON tenant_limits_audit
	FOR EACH ROW EXECUTE FUNCTION ratelimit_authz_audit_stamp();
DROP TRIGGER IF EXISTS tenant_key_owners_audit_stamp ON tenant_key_owners_audit;
CREATE TRIGGER tenant_key_owners_audit_stamp BEFORE INSERT OR UPDATE ON tenant_key_owners_audit
	FOR EACH ROW EXECUTE FUNCTION ratelimit_authz_audit_stamp();

-- The schema is wherever the migrations run (the first schema of the
-- migrating session's search_path), so it is looked up here, not written.
DO $$
DECLARE
	f text;
BEGIN
	IF current_schema() IS NULL THEN
		RAISE EXCEPTION 'ratelimit-authz migrate: no current schema (search_path is empty)';
	END IF;
	FOREACH f IN ARRAY ARRAY[
		'tenant_limits_problem(jsonb)',
		'tenant_limits_before()',
		'tenant_limits_after_row()',
		'tenant_limits_after_statement()',
		'tenant_limits_no_truncate()',
		'tenant_key_owners_before()',
		'tenant_key_owners_after_row()',
		'tenant_key_owners_after_statement()',
		'tenant_key_owners_no_truncate()',
		'ratelimit_authz_audit_stamp()'
	] LOOP
		EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
	END LOOP;
END
$$;
