package overrides

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
)

func encodeForTest(t testing.TB, fill func(*snapshotWriter)) []byte {
	t.Helper()
	var b bytes.Buffer
	sw := newSnapshotWriter(&b)
	fill(sw)
	if err := sw.finish(time.UnixMilli(1_700_000_000_000)); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func sampleSnapshot(t testing.TB) []byte {
	return encodeForTest(t, func(sw *snapshotWriter) {
		sw.override("bigco", limits.Override{Bucket: "inbound", Limit: 5000, ScaleMS: 1000})
		sw.override("bigco", limits.Override{Bucket: "activity_create", Limit: 300, ScaleMS: 1000})
		sw.override("a tenant with spaces", limits.Override{Bucket: "upload", Limit: 7, ScaleMS: 60_000})
		sw.owner("channel", "ch-123", "bigco")
		sw.owner("header:x-shop", "shop 1", "bigco")
	})
}

func TestSnapshotFileRoundTrip(t *testing.T) {
	fs, err := decodeSnapshot(bytes.NewReader(sampleSnapshot(t)), maxSnapshotBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs.Overrides["bigco"]) != 2 || fs.Overrides["bigco"][0] != (limits.Override{Bucket: "inbound", Limit: 5000, ScaleMS: 1000}) ||
		fs.Overrides["a tenant with spaces"][0].ScaleMS != 60_000 {
		t.Errorf("overrides %+v", fs.Overrides)
	}
	if len(fs.Owners) != 2 || fs.Owners[1] != (overridedb.Owner{KeyName: "header:x-shop", Key: "shop 1", Tenant: "bigco"}) {
		t.Errorf("owners %+v", fs.Owners)
	}
	if fs.Written.UnixMilli() != 1_700_000_000_000 {
		t.Errorf("written %v", fs.Written)
	}
}

// TestSnapshotFileRejectsBadFiles: every damaged or hostile file is
// rejected whole, with a reason.
func TestSnapshotFileRejectsBadFiles(t *testing.T) {
	good := sampleSnapshot(t)
	flip := bytes.Clone(good)
	flip[len(snapshotMagic)+5] ^= 1 // inside the first record: the digest no longer matches
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"other file", []byte("hello\n"), "not a snapshot file"},
		{"truncated at every byte", nil, ""}, // below
		{"a flipped bit", flip, ""},
		{"data after the end", append(bytes.Clone(good), "T\tx\tupload\t1\t1000\n"...), "after the end line"},
		{"counts lie", bytes.Replace(good, []byte("end\t3\t2"), []byte("end\t4\t2"), 1), "counts"},
		{"a long line", encodeForTest(t, func(sw *snapshotWriter) { sw.line("T", strings.Repeat("x", 70_000)) }), "longer than"},
		{"a bad tenant", encodeForTest(t, func(sw *snapshotWriter) {
			sw.override("t\x1b[2J", limits.Override{Bucket: "upload", Limit: 1, ScaleMS: 1000})
		}), "invalid tenant"},
		{"a bad limit", encodeForTest(t, func(sw *snapshotWriter) { sw.override("t", limits.Override{Bucket: "upload", Limit: 0, ScaleMS: 1000}) }), "invalid limit"},
		{"a bad window", encodeForTest(t, func(sw *snapshotWriter) { sw.override("t", limits.Override{Bucket: "upload", Limit: 1, ScaleMS: 7}) }), "invalid limit"},
		{"a huge limit", encodeForTest(t, func(sw *snapshotWriter) {
			sw.line("T", "t", "upload", "999999999999999999999", "1000")
			sw.entries++
		}), "invalid limit"},
		{"a repeated override", encodeForTest(t, func(sw *snapshotWriter) {
			sw.override("t", limits.Override{Bucket: "upload", Limit: 1, ScaleMS: 1000})
			sw.override("t", limits.Override{Bucket: "upload", Limit: 2, ScaleMS: 1000})
		}), "repeated override"},
		{"a repeated owner", encodeForTest(t, func(sw *snapshotWriter) { sw.owner("channel", "c", "a"); sw.owner("channel", "c", "b") }), "repeated owner"},
		{"a bad key name", encodeForTest(t, func(sw *snapshotWriter) { sw.owner("Header:X", "c", "a") }), "invalid owner"},
		{"too many fields", encodeForTest(t, func(sw *snapshotWriter) { sw.line("O", "channel", "c", "a", "extra"); sw.owners++ }), "fields"},
		{"an unknown record", encodeForTest(t, func(sw *snapshotWriter) { sw.line("X") }), "unknown record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "truncated at every byte" {
				for n := range len(good) - 1 {
					if _, err := decodeSnapshot(bytes.NewReader(good[:n]), maxSnapshotBytes); !errors.Is(err, ErrBadSnapshot) {
						t.Fatalf("truncated to %d bytes: %v", n, err)
					}
				}
				return
			}
			fs, err := decodeSnapshot(bytes.NewReader(tc.data), maxSnapshotBytes)
			if !errors.Is(err, ErrBadSnapshot) || fs != nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, %v; want ErrBadSnapshot with %q", fs, err, tc.want)
			}
		})
	}
}

func TestSnapshotFileTooLarge(t *testing.T) {
	// A stream longer than the bound is refused without reading it all.
	r := &endless{prefix: []byte(snapshotMagic + "\n")}
	_, err := decodeSnapshot(r, 1<<20)
	if !errors.Is(err, ErrBadSnapshot) || r.read > 2<<20 || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("%v after %d bytes", err, r.read)
	}
}

// endless is a header and then the same line for ever, each owner key
// different so that only the size bound stops it.
type endless struct {
	prefix  []byte
	read    int64
	n       int
	pending []byte
}

func (e *endless) Read(p []byte) (int, error) {
	if len(e.pending) == 0 {
		if e.prefix != nil {
			e.pending, e.prefix = e.prefix, nil
		} else {
			e.n++
			e.pending = []byte("O\tchannel\tk" + strings.Repeat("x", 100) + strconv.Itoa(e.n) + "\tt\n")
		}
	}
	n := copy(p, e.pending)
	e.pending = e.pending[n:]
	e.read += int64(n)
	return n, nil
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "overrides.snapshot")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A failed fill leaves the old file and no temporary file.
	if err := writeFileAtomic(path, func(w io.Writer) error {
		w.Write([]byte("half"))
		return errors.New("disk full")
	}); err == nil {
		t.Fatal("no error")
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("after a failed write: %q", b)
	}
	if err := writeFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write(sampleSnapshot(t))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %v", entries)
	}
	f, _ := os.Open(path)
	defer f.Close()
	if _, err := decodeSnapshot(f, maxSnapshotBytes); err != nil {
		t.Error(err)
	}
}

// FuzzDecodeSnapshot: no input crashes the decoder or is half accepted:
// whatever it accepts encodes back to a file that decodes the same.
func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(sampleSnapshot(f))
	f.Add([]byte(snapshotMagic + "\n"))
	f.Add([]byte(snapshotMagic + "\nend\t0\t0\t0\te3b0\n"))
	f.Add(encodeForTest(f, func(*snapshotWriter) {}))
	f.Add(encodeForTest(f, func(sw *snapshotWriter) { sw.owner("channel", "é ü", "t") }))
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, err := decodeSnapshot(bytes.NewReader(data), maxSnapshotBytes)
		if err != nil {
			if fs != nil || !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("error %v with a result %v", err, fs)
			}
			return
		}
		again := encodeForTest(t, func(sw *snapshotWriter) {
			for tenant, os := range fs.Overrides {
				for _, o := range os {
					sw.override(tenant, o)
				}
			}
			for _, o := range fs.Owners {
				sw.owner(o.KeyName, o.Key, o.Tenant)
			}
		})
		fs2, err := decodeSnapshot(bytes.NewReader(again), maxSnapshotBytes)
		if err != nil {
			t.Fatalf("re-encoded file rejected: %v", err)
		}
		if len(fs2.Owners) != len(fs.Owners) || len(fs2.Overrides) != len(fs.Overrides) {
			t.Fatalf("round trip changed the content")
		}
	})
}
