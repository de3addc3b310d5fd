package overrides

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// ApplicationName is the cache's application_name in pg_stat_activity,
// unless the URL sets one.
const ApplicationName = "ratelimit-authz"

// Config configures a Cache. A zero field means its default.
type Config struct {
	// URL is the PostgreSQL connection string (required), e.g.
	// postgres://user:pass@host:5432/db?sslmode=require.
	URL string
	// RefreshInterval is the longest time between two refreshes when no
	// notification arrives; 0 means 30 s.
	RefreshInterval time.Duration
	// FullRefreshInterval is the longest time between two full reloads
	// (a safety net for changes made with triggers disabled); 0 means 1 h,
	// at most 12 h (deleted tenants are remembered for a day).
	FullRefreshInterval time.Duration
	// QueryTimeout bounds connecting and each incremental refresh; a full
	// reload (a million tenants take seconds) gets four times as long.
	// 0 means 30 s.
	QueryTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between failed attempts
	// (doubling, with jitter); 0 means 250 ms and 10 s.
	MinBackoff, MaxBackoff time.Duration
	// SnapshotFile, when set, is where the cache keeps its last known
	// overrides and key owners on disk: written after every refresh that
	// changed something, read when the first load from Postgres fails.
	SnapshotFile string
}

func (c *Config) setDefaults() error {
	if c.URL == "" {
		return errors.New("overrides: no database URL")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.RefreshInterval, 30*time.Second)
	def(&c.FullRefreshInterval, time.Hour)
	def(&c.QueryTimeout, 30*time.Second)
	def(&c.MinBackoff, 250*time.Millisecond)
	def(&c.MaxBackoff, 10*time.Second)
	switch {
	case c.RefreshInterval < 0 || c.QueryTimeout < 0 || c.MinBackoff < 0 || c.FullRefreshInterval < 0:
		return errors.New("overrides: intervals and timeouts must not be negative")
	case c.FullRefreshInterval > 12*time.Hour:
		return fmt.Errorf("overrides: FullRefreshInterval %v is over 12 h; deletions are only remembered for a day", c.FullRefreshInterval)
	case c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("overrides: MaxBackoff %v is below MinBackoff %v", c.MaxBackoff, c.MinBackoff)
	}
	return nil
}

// shardCount splits the snapshot so that an incremental refresh copies only
// the shards it touches, not a million-tenant map. A power of two.
const shardCount = 64

// entry is one usable override, resolved against the configuration.
type entry struct {
	bucket counter.Bucket
	limit  counter.Limit
}

// table is the overrides in effect, immutable once published. It carries the view of the
// configuration its entries were resolved against, so that a reader that
// loads it once sees ids and owner indices that agree.
type table struct {
	view    *view
	shards  [shardCount]map[string][]entry
	entries int // overrides in effect
	// owners[i] maps a key of the owner key name i (Cache.ownerNames) to
	// its tenant.
	owners    []ownerShards
	ownerKeys int // owners in effect
}

type ownerShards [shardCount]map[string]string

// keyRoute says where a bucket's override comes from.
type keyRoute struct {
	kind  uint8 // routeNone, routeSelf or routeOwner
	owner int   // for routeOwner: index into Cache.ownerNames
}

const (
	routeNone  = iota // not overridable, or keyed by a client identity
	routeSelf         // keyed by tenant: the key is the tenant
	routeOwner        // keyed by something a tenant owns: look up the owner
)

// bucketInfo is what the cache needs of an overridable bucket.
type bucketInfo struct {
	index     counter.Bucket // the bucket's id in the counter
	algorithm counter.Algorithm
}

// view is what the cache needs of one configuration's buckets, immutable.
type view struct {
	buckets map[string]bucketInfo // overridable buckets by name
	// route and names are by bucket id; ownerNames are the owner key
	// names this configuration uses, ownerIndex their inverse.
	route      map[counter.Bucket]keyRoute
	names      map[counter.Bucket]string
	ownerNames []string
	ownerIndex map[string]int
}

// newView builds the view of the overridable buckets of snap (filed
// under their OverrideName), warning about those whose overrides can
// never apply.
func newView(snap *snapshot.Snapshot, log *slog.Logger) *view {
	v := &view{
		buckets: map[string]bucketInfo{}, ownerIndex: map[string]int{},
		route: map[counter.Bucket]keyRoute{}, names: map[counter.Bucket]string{},
	}
	v.ownerNames = snap.OwnerKeyNames()
	for i, n := range v.ownerNames {
		v.ownerIndex[n] = i
	}
	for i := range snap.Buckets {
		b := &snap.Buckets[i]
		if !b.Overridable {
			continue
		}
		// An override replaces the limit and window; the algorithm stays
		// the bucket's.
		v.names[b.ID] = b.OverrideName
		v.buckets[b.OverrideName] = bucketInfo{index: b.ID, algorithm: b.Limit.Algorithm}
		if b.Key.Kind == match.KeyTenant {
			v.route[b.ID] = keyRoute{kind: routeSelf}
		} else if n, ok := limits.OwnerKeyName(b.Key); ok {
			v.route[b.ID] = keyRoute{kind: routeOwner, owner: v.ownerIndex[n]}
		} else {
			log.Warn("bucket is overridable but keyed by a client identity that no tenant owns: its overrides never apply", "bucket", b.OverrideName, "key", b.Key.Kind.String())
		}
	}
	return v
}

func (v *view) name(id counter.Bucket) string { return v.names[id] }

var _ limits.Overrides = (*Cache)(nil)

// Cache is a node's in-memory copy of the overrides. Create it with
// NewCache; Override is safe for concurrent use and never blocks; Run keeps
// the copy current and must run once. The zero Cache is not usable.
type Cache struct {
	cfg     Config
	connCfg *pgx.ConnConfig
	log     *slog.Logger
	m       *metrics
	seed    maphash.Seed
	snap    atomic.Pointer[table]
	running atomic.Bool

	started     time.Time
	lastSuccess atomic.Int64 // unix ns of the last successful refresh; 0: none yet
	degraded    atomic.Bool
	source      atomic.Int32 // SourceNone, SourcePostgres or SourceSnapshotFile
	fileWritten atomic.Int64 // unix ms the served snapshot file was written
	lastErr     atomic.Pointer[string]

	// refreshing serialises refreshes (Load and Run) across their queries.
	// mu guards the state below, which refreshes publish and reloads
	// changes; a refresh holds it only to publish, never across a query.
	refreshing sync.Mutex
	mu         sync.Mutex
	watermark  string // xid8 as text: pg_snapshot_xmin of the last refresh; "": none
	lastFull   time.Time
	invalid    map[string]bool // tenants with a skipped row or entry
	// invalidOwners are owner rows skipped: by key name and key.
	invalidOwners map[[2]string]bool
}

// NewCache returns a Cache for the overridable buckets of snap. It does
// not connect: Load or Run does. Its metrics go to reg.
func NewCache(cfg Config, snap *snapshot.Snapshot, reg prometheus.Registerer, log *slog.Logger) (*Cache, error) {
	if snap == nil || reg == nil || log == nil {
		return nil, errors.New("overrides: NewCache needs the configured buckets, a registerer and a logger")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	connCfg, err := pgx.ParseConfig(cfg.URL)
	if err != nil {
		// The error text may hold the URL and its password: not repeated.
		return nil, errors.New("overrides: the database URL cannot be parsed (postgres://user:password@host:port/database?sslmode=…)")
	}
	if connCfg.RuntimeParams["application_name"] == "" {
		connCfg.RuntimeParams["application_name"] = ApplicationName // visible in pg_stat_activity
	}
	if _, set := connCfg.RuntimeParams["statement_timeout"]; !set {
		// The server ends a statement the cache gave up on: a full
		// reload's budget.
		connCfg.RuntimeParams["statement_timeout"] = strconv.FormatInt((4 * cfg.QueryTimeout).Milliseconds(), 10)
	}
	c := &Cache{
		cfg: cfg, connCfg: connCfg, log: log, seed: maphash.MakeSeed(),
		started: time.Now(), invalid: map[string]bool{},
		invalidOwners: map[[2]string]bool{},
	}
	v := newView(snap, log)
	c.degraded.Store(true) // until the first load
	c.m, err = newMetrics(reg, c)
	if err != nil {
		return nil, err
	}
	c.snap.Store(&table{view: v, owners: make([]ownerShards, len(v.ownerNames))})
	return c, nil
}

// Prepare validates snap and returns what makes it the configuration; it
// changes nothing itself. The swap re-resolves the overrides held against
// the buckets of the new configuration, by name: an override of a bucket
// that is no longer overridable, or gone, stops applying and its tenant
// counts among the invalid rows; key owners follow their key names. A
// lookup in flight finishes on the previous configuration. The next
// refresh re-reads the whole table (overrides skipped before for naming a
// bucket the new configuration adds apply from then on).
func (c *Cache) Prepare(snap *snapshot.Snapshot) (swap func(), err error) {
	if snap == nil {
		return nil, errors.New("overrides: Prepare needs the configuration")
	}
	v := newView(snap, c.log)
	return func() { c.update(v) }, nil
}

// update re-resolves the overrides held against v (see Prepare).
func (c *Cache) update(v *view) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.snap.Load()
	next := &table{view: v, owners: make([]ownerShards, len(v.ownerNames))}
	for i, sh := range old.shards {
		next.shards[i] = make(map[string][]entry, len(sh))
		for tenant, es := range sh {
			kept := make([]entry, 0, len(es))
			for _, e := range es {
				if b, ok := v.buckets[old.view.name(e.bucket)]; ok {
					kept = append(kept, entry{b.index, counter.Limit{Limit: e.limit.Limit, ScaleMS: e.limit.ScaleMS, Algorithm: b.algorithm}})
				}
			}
			if len(kept) < len(es) {
				c.invalid[tenant] = true
			}
			if len(kept) > 0 {
				next.shards[i][tenant] = kept
				next.entries += len(kept)
			}
		}
	}
	for i, n := range v.ownerNames {
		if j, ok := old.view.ownerIndex[n]; ok {
			next.owners[i] = old.owners[j] // immutable: shared
			for _, m := range next.owners[i] {
				next.ownerKeys += len(m)
			}
		}
	}
	c.snap.Store(next)
	c.lastFull = time.Time{} // the next refresh is a full one
	c.m.loaded.Set(float64(next.entries))
	c.m.ownersLoaded.Set(float64(next.ownerKeys))
	c.m.invalidRows.Set(float64(len(c.invalid) + len(c.invalidOwners)))
}

// OverrideFor returns the override of bucket (its id in the configured
// Buckets) for a request whose key of that bucket is key: for a bucket
// keyed by tenant, the override of the tenant key; for a bucket keyed by
// something a tenant owns (a channel), the override of the key's owner
// recorded in Postgres; for any other bucket, none. Nothing but the key
// decides it, so no other part of a request can change the limit of a key
// that other requests share. Like Override it reads memory only.
func (c *Cache) OverrideFor(bucket counter.Bucket, key string) (counter.Limit, bool) {
	s := c.snap.Load()
	if s.entries == 0 {
		return counter.Limit{}, false
	}
	r := s.view.route[bucket]
	if r.kind == routeNone {
		return counter.Limit{}, false
	}
	tenant := key
	if r.kind == routeOwner {
		if key == "" || len(key) > limits.MaxKeyValueBytes {
			return counter.Limit{}, false
		}
		tenant = s.owners[r.owner][maphash.String(c.seed, key)&(shardCount-1)][key]
	}
	return c.override(s, tenant, bucket)
}

// Override returns the tenant's override of bucket (its id in the
// configured Buckets), if any. It reads the current snapshot from memory: no
// lock, no I/O, no allocation.
func (c *Cache) Override(tenant string, bucket counter.Bucket) (counter.Limit, bool) {
	return c.override(c.snap.Load(), tenant, bucket)
}

func (c *Cache) override(s *table, tenant string, bucket counter.Bucket) (counter.Limit, bool) {
	if s.entries == 0 || len(tenant) > limits.MaxTenantBytes || tenant == "" {
		return counter.Limit{}, false
	}
	for _, e := range s.shards[maphash.String(c.seed, tenant)&(shardCount-1)][tenant] {
		if e.bucket == bucket {
			return e.limit, true
		}
	}
	return counter.Limit{}, false
}

// Degraded reports whether the cache is serving without a current view of
// the database: before the first load, or since a refresh failed.
func (c *Cache) Degraded() bool { return c.degraded.Load() }

// Load connects, reads every override and closes the connection: a node
// calls it before serving so that it starts with the overrides in place.
// On error the cache keeps what it had (and Run keeps trying).
func (c *Cache) Load(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	defer cancel()
	conn, err := c.connect(cctx)
	if err == nil {
		defer closeConn(conn)
		err = c.refresh(ctx, conn, true)
	}
	if err != nil {
		c.failed(err, 0)
		if c.lastSuccess.Load() == 0 && c.source.Load() == SourceNone {
			c.loadSnapshotFile()
		}
		return err
	}
	return nil
}

// Run keeps the snapshot current until ctx ends, then closes its
// connection and returns nil. Database trouble is logged, counted and
// retried with backoff; it is never returned.
func (c *Cache) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("overrides: Cache.Run called twice")
	}
	backoff := c.cfg.MinBackoff
	for {
		ok, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if ok { // it worked for a while: start over
			backoff = c.cfg.MinBackoff
		}
		// Full jitter in [backoff/2, backoff): nodes do not reconnect in step.
		wait := backoff/2 + rand.N(backoff/2+1)
		c.failed(err, wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(backoff*2, c.cfg.MaxBackoff)
	}
}

// session is one connection's life: listen, refresh, then wait for
// notifications or the refresh interval. It returns when the connection
// fails (ok: at least one refresh succeeded on it) or ctx ends.
func (c *Cache) session(ctx context.Context) (ok bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	conn, err := c.connect(cctx)
	if err == nil {
		// LISTEN before reading, so no change falls between the two.
		err = overridedb.Listen(cctx, conn)
	}
	cancel()
	if err != nil {
		if conn != nil {
			closeConn(conn)
		}
		return false, err
	}
	defer closeConn(conn)
	if err := c.refresh(ctx, conn, c.fullDue()); err != nil {
		return false, err
	}
	for {
		wait := c.cfg.RefreshInterval - time.Since(time.Unix(0, c.lastSuccess.Load()))
		wctx, cancel := context.WithTimeout(ctx, max(wait, 0))
		_, err := conn.WaitForNotification(wctx)
		timedOut := wctx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return true, nil
		case err != nil && !timedOut:
			return true, fmt.Errorf("overrides: wait for notifications: %w", err)
		case err == nil:
			c.drainNotifications(conn)
		}
		if err := c.refresh(ctx, conn, c.fullDue()); err != nil {
			return true, err
		}
	}
}

// drainNotifications discards those already received: the refresh that
// follows covers them all.
func (c *Cache) drainNotifications(conn *pgx.Conn) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		// With a done context only already-buffered notifications return.
		if n, _ := conn.WaitForNotification(done); n == nil {
			return
		}
	}
}

func (c *Cache) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, c.connCfg.Copy())
	if err != nil {
		return nil, fmt.Errorf("overrides: connect to %s: %w", c.connCfg.Host, err)
	}
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn.Close(ctx)
}

func (c *Cache) fullDue() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watermark == "" || time.Since(c.lastFull) >= c.cfg.FullRefreshInterval
}

// failed records a failed connect or refresh: degraded, counted, logged.
func (c *Cache) failed(err error, retryIn time.Duration) {
	c.m.reloadErrors.Inc()
	was := c.degraded.Swap(true)
	msg := err.Error()
	c.lastErr.Store(&msg)
	serving := "the last snapshot"
	switch {
	case c.source.Load() == SourceSnapshotFile:
		serving = "the snapshot file"
	case c.lastSuccess.Load() == 0:
		serving = "the configured limits (no snapshot yet)"
	}
	attrs := []any{"err", err, "serving", serving}
	if retryIn > 0 {
		attrs = append(attrs, "retry_in", retryIn.Round(time.Millisecond))
	}
	if !was || c.lastSuccess.Load() == 0 {
		c.log.Warn("tenant overrides degraded: cannot refresh from Postgres", attrs...)
	} else {
		c.log.Warn("tenant overrides still degraded", attrs...)
	}
}

// change is one tenant's new state read from the database.
type change struct {
	tenant  string
	entries []entry // nil: no overrides (deleted, or nothing usable)
	invalid bool
}

// maxViewRaces is how many reads in a row a refresh makes while reloads
// keep swapping the configuration under it before it gives up (the next
// refresh tries again).
const maxViewRaces = 3

// refresh reads the table (all of it, or what changed since the watermark)
// in one repeatable-read snapshot and publishes the result. The read runs
// without c.mu, so a reload never waits for a query; rows read
// while a reload swapped the configuration were resolved against the old
// buckets, so they are discarded and the table read again, whole.
func (c *Cache) refresh(ctx context.Context, conn *pgx.Conn, full bool) error {
	c.refreshing.Lock()
	defer c.refreshing.Unlock()
	for race := 1; ; race++ {
		c.mu.Lock()
		watermark, v := c.watermark, c.snap.Load().view
		c.mu.Unlock()
		if watermark == "" {
			full = true
		}
		start := time.Now()
		r, err := c.read(ctx, conn, full, watermark, v)
		if err != nil {
			return err
		}
		c.mu.Lock()
		if c.snap.Load().view != v {
			c.mu.Unlock()
			if race == maxViewRaces {
				return fmt.Errorf("overrides: refresh: the configuration changed during %d reads in a row", race)
			}
			full = true
			continue
		}
		c.publishRead(full, r, start)
		c.mu.Unlock()
		return nil
	}
}

// readResult is what one read of the table found.
type readResult struct {
	xmin    string
	changes []change
	owners  []ownerChange
	logged  int
}

// read runs one refresh's queries, resolving rows against the buckets of
// v. It touches no state of c but the logger and metrics.
func (c *Cache) read(ctx context.Context, conn *pgx.Conn, full bool, watermark string, v *view) (readResult, error) {
	kind := "incremental"
	if full {
		kind = "full"
	}
	timeout := c.cfg.QueryTimeout
	if full {
		timeout *= 4
		watermark = ""
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rd := &reader{c: c, v: v, a: arena{chunk: 16}}
	if full {
		rd.a.chunk = 4096
	}
	xmin, err := overridedb.Read(ctx, conn, watermark, rd)
	if err != nil {
		return readResult{}, fmt.Errorf("overrides: %s refresh: %w", kind, err)
	}
	rd.r.xmin = xmin
	return rd.r, nil
}

// reader resolves the rows of one read (an overridedb.Sink).
type reader struct {
	c *Cache
	v *view
	r readResult
	a arena
}

func (rd *reader) Tenant(tenant string, raw []byte) {
	rd.r.changes = append(rd.r.changes, rd.c.resolve(rd.v, tenant, raw, &rd.r.logged, &rd.a))
}

func (rd *reader) TenantDeleted(tenant string) {
	rd.r.changes = append(rd.r.changes, change{tenant: tenant})
}

func (rd *reader) Owner(keyName, key, tenant string) {
	rd.r.owners = append(rd.r.owners, rd.c.resolveOwner(rd.v, keyName, key, tenant, &rd.r.logged))
}

func (rd *reader) OwnerDeleted(keyName, key string) {
	o := ownerChange{name: keyName, key: key, owner: -1}
	if i, ok := rd.v.ownerIndex[keyName]; ok {
		o.owner = i
	}
	rd.r.owners = append(rd.r.owners, o)
}

// publishRead publishes what read found and advances the watermark.
// Called with c.mu held.
func (c *Cache) publishRead(full bool, r readResult, start time.Time) {
	kind := "incremental"
	if full {
		kind = "full"
	}
	if r.logged > maxLoggedProblems {
		c.log.Warn("more tenant override rows skipped", "count", r.logged-maxLoggedProblems)
	}
	c.publish(full, r.changes, r.owners)
	c.source.Store(SourcePostgres)
	if full || len(r.changes) > 0 || len(r.owners) > 0 {
		c.writeSnapshotFile()
	}
	c.watermark = r.xmin
	now := time.Now()
	if full {
		c.lastFull = now
	}
	c.m.reloads[kind].Inc()
	c.m.duration[kind].Observe(now.Sub(start).Seconds())
	prev := c.lastSuccess.Swap(now.UnixNano())
	if c.degraded.Swap(false) {
		if prev == 0 {
			c.log.Info("tenant overrides loaded", "tenants", c.countTenants(), "overrides", c.snap.Load().entries,
				"key_owners", c.snap.Load().ownerKeys, "invalid_rows", len(c.invalid)+len(c.invalidOwners))
		} else {
			c.log.Info("tenant overrides recovered", "stale_for", now.Sub(time.Unix(0, prev)).Round(time.Millisecond))
		}
	}
}

const maxLoggedProblems = 20

// arena hands out entry slices from shared chunks: a full reload of a
// million tenants makes a few hundred allocations for them, not a million.
type arena struct {
	buf   []entry
	chunk int
}

func (a *arena) take(n int) []entry {
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]entry, 0, max(a.chunk, n))
	}
	l := len(a.buf)
	a.buf = a.buf[:l+n]
	return a.buf[l : l+n : l+n]
}

// resolve turns a stored row into usable entries for this node's buckets,
// logging what it skips (up to maxLoggedProblems per refresh).
func (c *Cache) resolve(v *view, tenant string, raw []byte, logged *int, a *arena) change {
	ch := change{tenant: tenant}
	// The common case: the shape jsonb prints, every entry usable.
	var buf [overridedb.MaxFastEntries]overridedb.FastEntry
	if fast, ok := overridedb.FastEntries(raw, &buf); ok {
		usable := true
		for _, e := range fast {
			_, known := v.buckets[string(e.Bucket)]
			usable = usable && known && (limits.Override{Limit: e.Limit, ScaleMS: e.ScaleMS}).Valid()
		}
		if usable {
			if len(fast) > 0 {
				ch.entries = a.take(len(fast))
			}
			for i, e := range fast {
				b := v.buckets[string(e.Bucket)]
				ch.entries[i] = entry{b.index, counter.Limit{Limit: e.Limit, ScaleMS: e.ScaleMS, Algorithm: b.algorithm}}
			}
			return ch
		}
	}
	skip := func(bucket string, err error) {
		ch.invalid = true
		if *logged++; *logged <= maxLoggedProblems {
			c.log.Warn("tenant override skipped", "tenant", tenant, "bucket", bucket, "err", err)
		}
	}
	entries, problems, err := overridedb.ParseLimits(raw)
	if err != nil {
		skip("", err)
		return ch
	}
	for _, p := range problems {
		skip(p.Bucket, p.Err)
	}
	for _, o := range entries {
		b, ok := v.buckets[o.Bucket]
		if !ok {
			skip(o.Bucket, fmt.Errorf("%w: bucket %q is not an overridable bucket of this node's configuration", limits.ErrInvalid, o.Bucket))
			continue
		}
		ch.entries = append(ch.entries, entry{
			bucket: b.index,
			limit:  counter.Limit{Limit: o.Limit, ScaleMS: o.ScaleMS, Algorithm: b.algorithm},
		})
	}
	return ch
}

// publish builds the next snapshot: from scratch after a full read, else a
// copy of the current one in which only the touched shards are copied.
// Called with c.mu held.
func (c *Cache) publish(full bool, changes []change, owners []ownerChange) {
	old := c.snap.Load()
	next := &table{view: old.view}
	copied := [shardCount]bool{}
	if full {
		clear(c.invalid)
		clear(c.invalidOwners)
		// Sized once: no rehashing while a million tenants go in.
		var sizes [shardCount]int
		for _, ch := range changes {
			sizes[maphash.String(c.seed, ch.tenant)&(shardCount-1)]++
		}
		for i, n := range sizes {
			next.shards[i] = make(map[string][]entry, n)
			copied[i] = true
		}
	} else {
		*next = *old
	}
	for _, ch := range changes {
		i := maphash.String(c.seed, ch.tenant) & (shardCount - 1)
		if !copied[i] {
			copied[i] = true
			if next.shards[i] == nil {
				next.shards[i] = map[string][]entry{}
			} else {
				next.shards[i] = maps.Clone(next.shards[i])
			}
		}
		next.entries -= len(next.shards[i][ch.tenant])
		if len(ch.entries) == 0 {
			delete(next.shards[i], ch.tenant)
		} else {
			next.shards[i][ch.tenant] = ch.entries
			next.entries += len(ch.entries)
		}
		if ch.invalid {
			c.invalid[ch.tenant] = true
		} else {
			delete(c.invalid, ch.tenant)
		}
	}
	c.publishOwners(full, old, next, owners)
	c.snap.Store(next)
	c.m.loaded.Set(float64(next.entries))
	c.m.ownersLoaded.Set(float64(next.ownerKeys))
	c.m.invalidRows.Set(float64(len(c.invalid) + len(c.invalidOwners)))
}

// publishOwners applies owner changes to next, copying only the shards it
// touches (all of them after a full read). Called with c.mu held.
func (c *Cache) publishOwners(full bool, old, next *table, owners []ownerChange) {
	next.owners = make([]ownerShards, len(old.view.ownerNames))
	next.ownerKeys = 0
	if !full {
		copy(next.owners, old.owners)
		next.ownerKeys = old.ownerKeys
	}
	copied := make([][shardCount]bool, len(old.view.ownerNames))
	for _, o := range owners {
		k := [2]string{o.name, o.key}
		if o.invalid {
			c.invalidOwners[k] = true
		} else {
			delete(c.invalidOwners, k)
		}
		if o.owner < 0 {
			continue
		}
		i := maphash.String(c.seed, o.key) & (shardCount - 1)
		if !copied[o.owner][i] {
			copied[o.owner][i] = true
			next.owners[o.owner][i] = maps.Clone(next.owners[o.owner][i])
			if next.owners[o.owner][i] == nil {
				next.owners[o.owner][i] = map[string]string{}
			}
		}
		sh := next.owners[o.owner][i]
		if _, had := sh[o.key]; had {
			next.ownerKeys--
		}
		if o.tenant == "" {
			delete(sh, o.key)
		} else {
			sh[o.key] = o.tenant
			next.ownerKeys++
		}
	}
}

// ownerChange is one key's new owner read from the database.
type ownerChange struct {
	name, key string
	owner     int    // index into c.ownerNames; -1: a key name this node does not use
	tenant    string // "": no owner
	invalid   bool
}

// resolveOwner checks an owner row, logging what it skips.
func (c *Cache) resolveOwner(v *view, name, key, tenant string, logged *int) ownerChange {
	o := ownerChange{name: name, key: key, owner: -1}
	i, ok := v.ownerIndex[name]
	err := errors.Join(limits.ValidateKeyValue(key), limits.ValidateTenant(tenant))
	if err == nil && !ok {
		err = fmt.Errorf("%w: no overridable bucket of this node's configuration is keyed by %q", limits.ErrInvalid, name)
	}
	if err != nil {
		o.invalid = true
		if *logged++; *logged <= maxLoggedProblems {
			c.log.Warn("key owner skipped", "key_name", name, "key", key, "tenant", tenant, "err", err)
		}
		if ok {
			o.owner = i // drop any owner the key had
		}
		return o
	}
	o.owner, o.tenant = i, tenant
	return o
}

func (c *Cache) countTenants() int {
	n := 0
	for _, sh := range c.snap.Load().shards {
		n += len(sh)
	}
	return n
}

// snapshotAge is the time since the last successful refresh, or since the
// cache was created when none has succeeded.
func (c *Cache) snapshotAge() time.Duration {
	if ns := c.lastSuccess.Load(); ns != 0 {
		return time.Since(time.Unix(0, ns))
	}
	return time.Since(c.started)
}
