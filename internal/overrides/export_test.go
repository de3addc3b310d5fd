package overrides

// PublishForTest replaces the snapshot with rows (tenant → stored JSON), as
// a full refresh would, without a database: for benchmarks.
func (c *Cache) PublishForTest(rows map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var logged int
	a := arena{chunk: 4096}
	changes := make([]change, 0, len(rows))
	for tenant, raw := range rows {
		changes = append(changes, c.resolve(c.snap.Load().view, tenant, []byte(raw), &logged, &a))
	}
	c.publish(true, changes, nil)
}

// PublishOwnersForTest adds key owners (key name and key → tenant) to the
// snapshot, as an incremental refresh would.
func (c *Cache) PublishOwnersForTest(owners map[[2]string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var logged int
	var changes []ownerChange
	for k, tenant := range owners {
		changes = append(changes, c.resolveOwner(c.snap.Load().view, k[0], k[1], tenant, &logged))
	}
	c.publish(false, nil, changes)
}
