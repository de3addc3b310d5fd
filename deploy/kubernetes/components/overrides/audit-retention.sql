-- Audit retention for ratelimit-authz: delete audit rows older than the
-- retention given as the psql variable "retention" (an interval, at least
-- 30 days), in one transaction. Run by the audit-retention CronJob:
--   psql "$DATABASE_URL" --no-psqlrc -v ON_ERROR_STOP=1 -v retention='400 days' -f audit-retention.sql
-- Only the audit tables are touched; the overrides, the owners and the
-- change-tracking tables are not (the server prunes its deletions itself).
\set ON_ERROR_STOP on
BEGIN;
-- The retention travels as a setting, never spliced into SQL text: psql
-- quotes it as a literal (:'retention').
SELECT set_config('ratelimit_authz.audit_retention', :'retention', true);
DO $$
DECLARE
	retention interval := current_setting('ratelimit_authz.audit_retention')::interval;
	limits_deleted bigint;
	owners_deleted bigint;
BEGIN
	IF retention < interval '30 days' THEN
		RAISE EXCEPTION 'audit retention %: want at least 30 days', retention
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	DELETE FROM tenant_limits_audit WHERE at < now() - retention;
	GET DIAGNOSTICS limits_deleted = ROW_COUNT;
	DELETE FROM tenant_key_owners_audit WHERE at < now() - retention;
	GET DIAGNOSTICS owners_deleted = ROW_COUNT;
	RAISE NOTICE 'audit retention %: deleted % tenant_limits_audit and % tenant_key_owners_audit rows',
		retention, limits_deleted, owners_deleted;
END
$$;
COMMIT;
