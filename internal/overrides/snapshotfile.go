package overrides

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
)

// The snapshot file keeps a node's last known overrides and key owners on
// local disk, so that a node started while Postgres is away or hung serves
// them instead of none. It is written after every refresh that changed
// something (write a temporary file, fsync, rename over the old one, fsync
// the directory: a crash leaves the old file or the new one, never a mix)
// and read only when the first load from Postgres fails.
//
// The format is text, one record a line, fields separated by tabs (tenants
// and keys hold no control characters, so no escaping):
//
//	ratelimit-authz overrides snapshot v1
//	T	TENANT	BUCKET	LIMIT	SCALE_MS
//	O	KEY_NAME	KEY	TENANT
//	end	OVERRIDES	OWNERS	WRITTEN_UNIX_MS	SHA256
//
// where SHA256 is the hex digest of every byte before the end line. A file
// that is truncated, corrupt, too large or out of shape in any way is
// rejected whole: never half loaded.

const snapshotMagic = "ratelimit-authz overrides snapshot v1"

// maxSnapshotBytes bounds the file read (and so the memory a hostile file
// can make a node use): a million tenants with two overrides each and a
// million key owners take about 120 MB.
const maxSnapshotBytes = 256 << 20

// maxSnapshotTenantEntries bounds one tenant's overrides in a file (a
// tenant has at most one per overridable bucket).
const maxSnapshotTenantEntries = 256

// maxSnapshotLine is above the longest valid record (a 1024-byte key and a
// 256-byte tenant).
const maxSnapshotLine = 4096

// ErrBadSnapshot is wrapped by every error decoding a snapshot file.
var ErrBadSnapshot = errors.New("bad overrides snapshot file")

// fileSnapshot is a decoded snapshot file.
type fileSnapshot struct {
	Overrides map[string][]limits.Override // by tenant, each by bucket
	Owners    []overridedb.Owner           // KeyName, Key, Tenant
	Written   time.Time
}

// decodeSnapshot reads a snapshot file of at most maxBytes, checking
// everything: shape, bounds, counts, duplicates and the digest.
func decodeSnapshot(r io.Reader, maxBytes int64) (*fileSnapshot, error) {
	d := &snapshotDecoder{
		h:        sha256.New(),
		br:       bufio.NewReaderSize(io.LimitReader(r, maxBytes+1), 64<<10),
		maxBytes: maxBytes,
		fs:       &fileSnapshot{Overrides: map[string][]limits.Override{}},
		ownerSet: map[[2]string]bool{},
	}
	for n := 1; ; n++ {
		line, err := d.readLine(n)
		if err != nil {
			return nil, err
		}
		body := line[:len(line)-1]
		if n == 1 {
			if string(body) != snapshotMagic {
				return nil, badLine(n, "not a snapshot file (want the first line %q)", snapshotMagic)
			}
			d.h.Write(line)
			continue
		}
		f := bytes.Split(body, []byte{'\t'})
		switch string(f[0]) {
		case "T":
			err = d.override(n, f)
		case "O":
			err = d.owner(n, f)
		case "end":
			return d.end(n, f)
		default:
			err = badLine(n, "unknown record %.10q", f[0])
		}
		if err != nil {
			return nil, err
		}
		d.h.Write(line)
	}
}

// snapshotDecoder is the state of one decodeSnapshot: the digest of the
// lines before the current one, the bytes read and the records so far.
type snapshotDecoder struct {
	h        hash.Hash
	br       *bufio.Reader // reads at most maxBytes+1 bytes
	maxBytes int64
	total    int64 // bytes read, the current line included
	fs       *fileSnapshot
	entries  int                // overrides in fs
	ownerSet map[[2]string]bool // KeyName, Key of the owners in fs
}

// badLine is an ErrBadSnapshot error about line n.
func badLine(n int, format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrBadSnapshot, n, fmt.Sprintf(format, args...))
}

// readLine reads line n, newline included, within maxSnapshotLine and
// the file's bound. The line is valid until the next read.
func (d *snapshotDecoder) readLine(n int) ([]byte, error) {
	line, err := d.br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull) || len(line) > maxSnapshotLine:
		return nil, badLine(n, "longer than %d bytes", maxSnapshotLine)
	case errors.Is(err, io.EOF) && d.total+int64(len(line)) > d.maxBytes:
		return nil, badLine(n, "the file is larger than %d bytes", d.maxBytes)
	case errors.Is(err, io.EOF):
		return nil, badLine(n, "the file ends before its end line (truncated)")
	case err != nil:
		return nil, fmt.Errorf("%w: read: %v", ErrBadSnapshot, err)
	}
	if d.total += int64(len(line)); d.total > d.maxBytes {
		return nil, badLine(n, "the file is larger than %d bytes", d.maxBytes)
	}
	return line, nil
}

// override adds the override record f of line n.
func (d *snapshotDecoder) override(n int, f [][]byte) error {
	if len(f) != 5 {
		return badLine(n, "an override has %d fields, want 5", len(f))
	}
	tenant, bucket := string(f[1]), string(f[2])
	limit, err1 := plainInt(f[3])
	scale, err2 := plainInt(f[4])
	o := limits.Override{Bucket: bucket, Limit: limit, ScaleMS: scale}
	switch {
	case limits.ValidateTenant(tenant) != nil:
		return badLine(n, "invalid tenant")
	case !match.ValidBucketName(bucket):
		return badLine(n, "invalid bucket name")
	case err1 != nil || err2 != nil || !o.Valid():
		return badLine(n, "invalid limit or window")
	case slices.ContainsFunc(d.fs.Overrides[tenant], func(p limits.Override) bool { return p.Bucket == bucket }):
		return badLine(n, "a repeated override")
	case len(d.fs.Overrides[tenant]) >= maxSnapshotTenantEntries:
		return badLine(n, "more than %d overrides for one tenant", maxSnapshotTenantEntries)
	}
	d.fs.Overrides[tenant] = append(d.fs.Overrides[tenant], o)
	d.entries++
	return nil
}

// owner adds the key owner record f of line n.
func (d *snapshotDecoder) owner(n int, f [][]byte) error {
	if len(f) != 4 {
		return badLine(n, "an owner has %d fields, want 4", len(f))
	}
	o := overridedb.Owner{KeyName: string(f[1]), Key: string(f[2]), Tenant: string(f[3])}
	k := [2]string{o.KeyName, o.Key}
	switch {
	case limits.ValidateKeyName(o.KeyName) != nil || limits.ValidateKeyValue(o.Key) != nil || limits.ValidateTenant(o.Tenant) != nil:
		return badLine(n, "invalid owner")
	case d.ownerSet[k]:
		return badLine(n, "a repeated owner")
	}
	d.ownerSet[k] = true
	d.fs.Owners = append(d.fs.Owners, o)
	return nil
}

// end checks the end line f (line n) against the records and the digest,
// and that nothing follows it; it returns the decoded file.
func (d *snapshotDecoder) end(n int, f [][]byte) (*fileSnapshot, error) {
	if len(f) != 5 {
		return nil, badLine(n, "the end line has %d fields, want 5", len(f))
	}
	wantEntries, err1 := plainInt(f[1])
	wantOwners, err2 := plainInt(f[2])
	written, err3 := plainInt(f[3])
	sum := hex.EncodeToString(d.h.Sum(nil))
	switch {
	case err1 != nil || err2 != nil || err3 != nil:
		return nil, badLine(n, "the end line's counts are not numbers")
	case string(f[4]) != sum:
		return nil, badLine(n, "the digest does not match the content (corrupt)")
	case wantEntries != int64(d.entries) || wantOwners != int64(len(d.fs.Owners)):
		return nil, badLine(n, "counts %d overrides and %d owners, the file holds %d and %d", wantEntries, wantOwners, d.entries, len(d.fs.Owners))
	}
	if _, err := d.br.ReadByte(); !errors.Is(err, io.EOF) {
		return nil, badLine(n+1, "data after the end line")
	}
	d.fs.Written = time.UnixMilli(written)
	return d.fs, nil
}

// plainInt reads a non-negative decimal of at most 18 digits.
func plainInt(b []byte) (int64, error) {
	if len(b) == 0 || len(b) > 18 || (len(b) > 1 && b[0] == '0') {
		return 0, errors.New("not a plain number")
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errors.New("not a plain number")
		}
		n = n*10 + int64(c-'0')
	}
	return n, nil
}

// snapshotWriter writes records and the end line.
type snapshotWriter struct {
	w               *bufio.Writer
	h               hash.Hash
	entries, owners int
	buf             []byte
}

func newSnapshotWriter(w io.Writer) *snapshotWriter {
	sw := &snapshotWriter{w: bufio.NewWriterSize(w, 64<<10), h: sha256.New()}
	sw.line(snapshotMagic)
	return sw
}

func (sw *snapshotWriter) line(fields ...string) {
	sw.buf = sw.buf[:0]
	for i, f := range fields {
		if i > 0 {
			sw.buf = append(sw.buf, '\t')
		}
		sw.buf = append(sw.buf, f...)
	}
	sw.buf = append(sw.buf, '\n')
	sw.w.Write(sw.buf)
	sw.h.Write(sw.buf)
}

func (sw *snapshotWriter) override(tenant string, o limits.Override) {
	sw.entries++
	sw.line("T", tenant, o.Bucket, strconv.FormatInt(o.Limit, 10), strconv.FormatInt(o.ScaleMS, 10))
}

func (sw *snapshotWriter) owner(keyName, key, tenant string) {
	sw.owners++
	sw.line("O", keyName, key, tenant)
}

func (sw *snapshotWriter) finish(written time.Time) error {
	sum := hex.EncodeToString(sw.h.Sum(nil))
	fmt.Fprintf(sw.w, "end\t%d\t%d\t%d\t%s\n", sw.entries, sw.owners, written.UnixMilli(), sum)
	return sw.w.Flush()
}

// writeFileAtomic writes a file through fill: a temporary file in the same
// directory, fsync, rename over path, fsync the directory.
func writeFileAtomic(path string, fill func(io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = fill(tmp); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Where the overrides a cache serves came from.
const (
	SourceNone         = iota // nothing loaded: the configured limits
	SourcePostgres            // the last successful refresh
	SourceSnapshotFile        // the snapshot file, Postgres not reached since start
)

var sourceNames = [...]string{SourceNone: "none", SourcePostgres: "postgres", SourceSnapshotFile: "snapshot"}

// writeSnapshotFile writes the current snapshot to the snapshot file, if
// one is configured; a failure is logged and counted, never fatal. Called
// with c.mu held.
func (c *Cache) writeSnapshotFile() {
	if c.cfg.SnapshotFile == "" {
		return
	}
	s := c.snap.Load()
	err := writeFileAtomic(c.cfg.SnapshotFile, func(w io.Writer) error {
		sw := newSnapshotWriter(w)
		for _, sh := range s.shards {
			for tenant, es := range sh {
				for _, e := range es {
					sw.override(tenant, limits.Override{Bucket: s.view.name(e.bucket), Limit: e.limit.Limit, ScaleMS: e.limit.ScaleMS})
				}
			}
		}
		for i, o := range s.owners {
			for _, sh := range o {
				for key, tenant := range sh {
					sw.owner(s.view.ownerNames[i], key, tenant)
				}
			}
		}
		return sw.finish(time.Now())
	})
	if err != nil {
		c.m.fileErrors["write"].Inc()
		c.log.Warn("cannot write the overrides snapshot file; a restart while Postgres is away would serve an older one or none",
			"path", c.cfg.SnapshotFile, "err", err)
	}
}

// loadSnapshotFile serves the snapshot file, when one is configured and
// valid: the first load from Postgres failed. Called with c.mu not held.
func (c *Cache) loadSnapshotFile() {
	if c.cfg.SnapshotFile == "" {
		c.log.Warn("tenant overrides: none, serving the configured limits: Postgres cannot be reached and no snapshot file is configured (--overrides-snapshot)")
		return
	}
	f, err := os.Open(c.cfg.SnapshotFile)
	if errors.Is(err, os.ErrNotExist) {
		c.log.Warn("tenant overrides: none, serving the configured limits: Postgres cannot be reached and the snapshot file does not exist yet",
			"path", c.cfg.SnapshotFile)
		return
	}
	var fs *fileSnapshot
	if err == nil {
		fs, err = decodeSnapshot(f, maxSnapshotBytes)
		f.Close()
	}
	if err != nil {
		c.m.fileErrors["read"].Inc()
		c.log.Error("tenant overrides: none, serving the configured limits: Postgres cannot be reached and the snapshot file is rejected",
			"path", c.cfg.SnapshotFile, "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastSuccess.Load() != 0 { // Postgres answered meanwhile
		return
	}
	var (
		logged  int
		changes = make([]change, 0, len(fs.Overrides))
		owners  = make([]ownerChange, 0, len(fs.Owners))
	)
	v := c.snap.Load().view
	for tenant, stored := range fs.Overrides {
		ch := change{tenant: tenant}
		for _, o := range stored {
			b, ok := v.buckets[o.Bucket]
			if !ok {
				ch.invalid = true
				if logged++; logged <= maxLoggedProblems {
					c.log.Warn("tenant override in the snapshot file skipped: not an overridable bucket of this node's configuration", "tenant", tenant, "bucket", o.Bucket)
				}
				continue
			}
			ch.entries = append(ch.entries, entry{b.index, counter.Limit{Limit: o.Limit, ScaleMS: o.ScaleMS, Algorithm: b.algorithm}})
		}
		changes = append(changes, ch)
	}
	for _, o := range fs.Owners {
		owners = append(owners, c.resolveOwner(v, o.KeyName, o.Key, o.Tenant, &logged))
	}
	c.publish(true, changes, owners)
	c.source.Store(SourceSnapshotFile)
	c.fileWritten.Store(fs.Written.UnixMilli())
	s := c.snap.Load()
	c.log.Warn("tenant overrides: serving the snapshot file until Postgres answers",
		"path", c.cfg.SnapshotFile, "written", fs.Written.UTC().Format(time.RFC3339), "overrides", s.entries, "key_owners", s.ownerKeys)
}

// Source is where the overrides served came from: SourceNone,
// SourcePostgres or SourceSnapshotFile.
func (c *Cache) Source() int { return int(c.source.Load()) }

// SourceName is Source's name: "none", "postgres" or "snapshot", as the
// ratelimit_authz_overrides_source metric labels it.
func (c *Cache) SourceName() string { return sourceNames[c.Source()] }

// State describes in one line where the overrides served come from and
// whether they are current, for /readyz and operators.
func (c *Cache) State() string {
	s := c.snap.Load()
	counts := fmt.Sprintf("%d overrides, %d key owners", s.entries, s.ownerKeys)
	why := ""
	if p := c.lastErr.Load(); p != nil && c.degraded.Load() {
		why = ": " + *p
	}
	switch c.source.Load() {
	case SourcePostgres:
		if !c.degraded.Load() {
			return "overrides: postgres, current (" + counts + ")"
		}
		return fmt.Sprintf("overrides: postgres, stale for %v (%s); Postgres cannot be reached%s", c.snapshotAge().Round(time.Second), counts, why)
	case SourceSnapshotFile:
		written := time.UnixMilli(c.fileWritten.Load()).UTC().Format(time.RFC3339)
		return fmt.Sprintf("overrides: snapshot file %s written %s (%s); Postgres cannot be reached%s", c.cfg.SnapshotFile, written, counts, why)
	}
	return "overrides: none, the configured limits only; Postgres cannot be reached" + why
}
