package main

// overridesConfig are serve's tenant-override settings.
type overridesConfig struct {
	db       databaseFlags
	snapshot string // snapshot file; "" = none
}

func (o *overridesConfig) addFlags(f *envFlags) {
	o.db.addFlags(f)
	f.String(&o.snapshot, "overrides-snapshot", "RATELIMIT_AUTHZ_OVERRIDES_SNAPSHOT", "", "`file` where the node keeps its last known tenant overrides and key owners, served when it starts while Postgres cannot be reached (recommended with a database; the directory must be writable)")
}
