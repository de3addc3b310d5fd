// Package image builds the ratelimit-authz container image without a
// container engine: one layer on an empty base holding the static server
// binary, the shipped configuration, CA certificates and the passwd/group
// entries of its non-root user, written as an OCI image layout (for skopeo,
// crane or a registry push) and as a tarball that `docker load` reads.
//
// The build is reproducible: every tar entry has a fixed time, owner and
// mode and the entries are sorted, the config's timestamps are fixed, and
// gzip writes no name or time, so the same inputs give the same digest.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// Paths inside the image.
const (
	BinaryPath = "/ratelimit-authz"
	ConfigPath = "/etc/ratelimit-authz/ratelimit.yaml"
	CACertPath = "/etc/ssl/certs/ca-certificates.crt" // where Go's crypto/x509 looks first on Linux
	StateDir   = "/var/lib/ratelimit-authz"           // the user's own folder, for --overrides-snapshot
)

// The image's user: numeric, so that Kubernetes' runAsNonRoot can verify it
// without reading /etc/passwd.
const (
	UID = 65532
	GID = 65532
)

// Ports the image listens on (set by its environment; see Env). Envoy's
// ext_authz filter calls CheckPort, the lean Check listener (Check and
// health only, cheaper per check); its access log, RLS and RLQS call
// GRPCPort.
const (
	GRPCPort  = 9001
	CheckPort = 9002
	HTTPPort  = 9090
)

// Epoch is the time of every file and of the image config.
var Epoch = time.Unix(0, 0).UTC()

// Config is what goes into an image. Every field is required.
type Config struct {
	Binary   []byte // the static ratelimit-authz binary
	Settings []byte // the configuration file shipped at ConfigPath
	Version  string // org.opencontainers.image.version
	Revision string // org.opencontainers.image.revision (a commit)
	Source   string // org.opencontainers.image.source (a URL)
	License  string // org.opencontainers.image.licenses (an SPDX expression)
	Arch     string // GOARCH of the binary: amd64, arm64
}

// Env is the image's environment. Inside a container, loopback is the
// container itself: the listeners bind every interface of its network
// namespace, and the deployment's network policy decides who reaches them.
func Env() []string {
	return []string{
		"RATELIMIT_AUTHZ_CONFIG=" + ConfigPath,
		fmt.Sprintf("RATELIMIT_AUTHZ_GRPC_ADDR=0.0.0.0:%d", GRPCPort),
		fmt.Sprintf("RATELIMIT_AUTHZ_CHECK_ADDR=0.0.0.0:%d", CheckPort),
		fmt.Sprintf("RATELIMIT_AUTHZ_HTTP_ADDR=0.0.0.0:%d", HTTPPort),
	}
}

// Entrypoint is the image's ENTRYPOINT.
func Entrypoint() []string { return []string{BinaryPath, "serve"} }

// Build returns the image of cfg.
func Build(cfg Config) (v1.Image, error) {
	layerTar, err := LayerTar(cfg)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	return assemble(cfg, layer)
}

// LayerTar returns the image's only layer, uncompressed: the root
// filesystem (the Dockerfile extracts it onto scratch).
func LayerTar(cfg Config) ([]byte, error) {
	switch {
	case len(cfg.Binary) == 0:
		return nil, errors.New("image: no binary")
	case len(cfg.Settings) == 0:
		return nil, errors.New("image: no configuration file")
	case cfg.Version == "" || cfg.Source == "" || cfg.License == "" || cfg.Arch == "":
		return nil, errors.New("image: version, source, license and arch are required")
	}
	certs, err := CACertificates()
	if err != nil {
		return nil, err
	}
	files := []file{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", GID)},
		{name: "etc/passwd", mode: 0o644, data: fmt.Appendf(nil,
			"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:%s:/sbin/nologin\n", UID, GID, StateDir)},
		{name: "etc/ratelimit-authz/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(ConfigPath, "/"), mode: 0o644, data: cfg.Settings},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(CACertPath, "/"), mode: 0o644, data: certs},
		{name: strings.TrimPrefix(BinaryPath, "/"), mode: 0o755, data: cfg.Binary},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "var/", mode: 0o755, dir: true},
		{name: "var/lib/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(StateDir, "/") + "/", mode: 0o700, dir: true, uid: UID, gid: GID},
	}
	return tarFiles(files)
}

func assemble(cfg Config, layer v1.Layer) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: Epoch}, CreatedBy: "ratelimit-authz build-image", Comment: "static binary, configuration, CA certificates, user"},
	})
	if err != nil {
		return nil, fmt.Errorf("image: append the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: Epoch}
	cf.Architecture = cfg.Arch
	cf.OS = "linux"
	cf.Author = ""
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", UID, GID),
		Entrypoint: Entrypoint(),
		Env:        Env(),
		WorkingDir: "/",
		ExposedPorts: map[string]struct{}{
			fmt.Sprintf("%d/tcp", GRPCPort):  {},
			fmt.Sprintf("%d/tcp", CheckPort): {},
			fmt.Sprintf("%d/tcp", HTTPPort):  {},
		},
		Labels: Labels(cfg),
		// SIGTERM starts the graceful shutdown (drain, then stop).
		StopSignal: "SIGTERM",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: set the config: %w", err)
	}
	return img, nil
}

// Labels are the image's OCI annotations (also written on the layout's
// index entry).
func Labels(cfg Config) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "ratelimit-authz",
		"org.opencontainers.image.description": "Rate limiting for Envoy's ext_authz: in-memory counters shared over NATS, tenant overrides from Postgres",
		"org.opencontainers.image.version":     cfg.Version,
		"org.opencontainers.image.revision":    cfg.Revision,
		"org.opencontainers.image.source":      cfg.Source,
		"org.opencontainers.image.url":         cfg.Source,
		"org.opencontainers.image.licenses":    cfg.License,
		"org.opencontainers.image.created":     Epoch.Format(time.RFC3339),
		"org.opencontainers.image.base.name":   "scratch",
	}
}

// CACertificates returns the root certificates of Go's
// golang.org/x/crypto/x509roots/fallback bundle (Mozilla's NSS trust
// store, pinned by go.sum, so every machine writes the same file) as PEM.
// Roots with an NSS constraint that X.509 cannot express (distrust after a
// date) are left out: a PEM file cannot carry the constraint.
func CACertificates() ([]byte, error) {
	var buf bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, fmt.Errorf("image: CA certificates: %w", err)
		}
		n++
	}
	if n == 0 {
		return nil, errors.New("image: the CA bundle is empty")
	}
	return buf.Bytes(), nil
}

type file struct {
	name     string // relative, "/"-separated; a folder ends in "/"
	mode     int64
	data     []byte
	dir      bool
	uid, gid int
}

// tarFiles writes files sorted by name with fixed times and owners (root
// unless the file says otherwise) and no user or group names.
func tarFiles(files []file) ([]byte, error) {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.name, b.name) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, f := range files {
		if i > 0 && files[i-1].name == f.name {
			return nil, fmt.Errorf("image: %s twice", f.name)
		}
		if parent := path.Dir(strings.TrimSuffix(f.name, "/")); parent != "." && !slices.ContainsFunc(files, func(g file) bool { return g.name == parent+"/" }) {
			return nil, fmt.Errorf("image: %s: no folder %s/", f.name, parent)
		}
		h := &tar.Header{
			Name:    f.name,
			Mode:    f.mode,
			Uid:     f.uid,
			Gid:     f.gid,
			ModTime: Epoch,
			Format:  tar.FormatPAX,
		}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("image: tar %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("image: tar %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: tar: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteLayout writes img as an OCI image layout in dir (which must not
// exist yet), its index entry named ref (org.opencontainers.image.ref.name,
// the tag that `skopeo copy oci:DIR:REF` picks).
func WriteLayout(dir, ref string, img v1.Image, labels map[string]string) error {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("image: %s exists; remove it first", dir)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image: layout %s: %w", dir, err)
	}
	ann := map[string]string{"org.opencontainers.image.ref.name": ref}
	for k, v := range labels {
		ann[k] = v
	}
	if err := p.AppendImage(img, layout.WithAnnotations(ann)); err != nil {
		return fmt.Errorf("image: layout %s: %w", dir, err)
	}
	return nil
}

// WriteTarball writes img to file in the format `docker load` reads,
// tagged ref (for example ratelimit-authz:v1.2.3).
func WriteTarball(file, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image: tag %q: %w", ref, err)
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := tarball.Write(tag, img, f); err != nil {
		f.Close()
		return fmt.Errorf("image: tarball %s: %w", file, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("image: tarball %s: %w", file, err)
	}
	return nil
}
