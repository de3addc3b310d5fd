package tenantlimits

// PublishForTest replaces the snapshot with rows (tenant → stored JSON), as
// a full refresh would, without a database: for benchmarks.
func (c *Cache) PublishForTest(rows map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var logged int
	a := arena{chunk: 4096}
	changes := make([]change, 0, len(rows))
	for tenant, raw := range rows {
		changes = append(changes, c.resolve(tenant, []byte(raw), &logged, &a))
	}
	c.publish(true, changes)
}
