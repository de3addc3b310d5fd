package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/ratelimit-authz/ratelimit-authz/deploy/image"
	"github.com/ratelimit-authz/ratelimit-authz/deploy/internal/serverbin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/proc"
)

// serverBin is the static server, built once for this test binary.
var serverBin string

func TestMain(m *testing.M) { serverbin.Main(m, &serverBin) }

func testConfig(t *testing.T) image.Config {
	t.Helper()
	bin, err := os.ReadFile(serverBin)
	if err != nil {
		t.Fatal(err)
	}
	root, err := serverbin.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	settings, err := os.ReadFile(filepath.Join(root, "config", "ratelimit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return image.Config{Binary: bin, Settings: settings, Version: "v0.0.0-test", Revision: "0123abc",
		Source: "https://github.com/ratelimit-authz/ratelimit-authz", License: "NOASSERTION", Arch: runtime.GOARCH}
}

// The image of testConfig, built once for the tests that only read it:
// its layer is compressed once (compression dominates the cost under -race).
var (
	sharedOnce sync.Once
	sharedImg  v1.Image
	sharedErr  error
)

func shared(t *testing.T) v1.Image {
	t.Helper()
	cfg := testConfig(t)
	sharedOnce.Do(func() { sharedImg, sharedErr = image.Build(cfg) })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedImg
}

func build(t *testing.T, cfg image.Config) v1.Image {
	t.Helper()
	img, err := image.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// treeHash hashes every file of a folder with its relative name.
func treeHash(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fileHash(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestBuildIsReproducible: two builds of the same inputs give the same
// image digest, the same layout bytes and the same tarball; a changed
// input changes the digest.
func TestBuildIsReproducible(t *testing.T) {
	cfg := testConfig(t)
	a, b := shared(t), build(t, cfg)
	if da, db := digest(t, a), digest(t, b); da != db {
		t.Fatalf("two builds: %s and %s", da, db)
	}
	dir := t.TempDir()
	for n, img := range map[string]v1.Image{"1": a, "2": b} {
		if err := image.WriteLayout(filepath.Join(dir, "layout"+n), cfg.Version, img, image.Labels(cfg)); err != nil {
			t.Fatal(err)
		}
		if err := image.WriteTarball(filepath.Join(dir, "image"+n+".tar"), "ratelimit-authz:"+cfg.Version, img); err != nil {
			t.Fatal(err)
		}
	}
	if h1, h2 := treeHash(t, filepath.Join(dir, "layout1")), treeHash(t, filepath.Join(dir, "layout2")); h1 != h2 {
		t.Errorf("two layouts differ: %s and %s", h1, h2)
	}
	if h1, h2 := fileHash(t, filepath.Join(dir, "image1.tar")), fileHash(t, filepath.Join(dir, "image2.tar")); h1 != h2 {
		t.Errorf("two tarballs differ: %s and %s", h1, h2)
	}
	if err := image.WriteLayout(filepath.Join(dir, "layout1"), cfg.Version, a, nil); err == nil {
		t.Error("WriteLayout over an existing folder: no error")
	}

	// Which inputs reach the digest: checked on a small stand-in binary,
	// so that each build compresses little.
	small := cfg
	small.Binary = []byte("\x7fELF stand-in")
	base := digest(t, build(t, small))
	if base != digest(t, build(t, small)) {
		t.Fatal("two builds of the stand-in differ")
	}
	for what, change := range map[string]func(*image.Config){
		"binary":   func(c *image.Config) { c.Binary = append(slices.Clone(c.Binary), 0) },
		"config":   func(c *image.Config) { c.Settings = append(slices.Clone(c.Settings), '\n') },
		"version":  func(c *image.Config) { c.Version += "-2" },
		"revision": func(c *image.Config) { c.Revision = "4567def" },
		"arch":     func(c *image.Config) { c.Arch = "arm64-test" },
	} {
		c := small
		change(&c)
		if digest(t, build(t, c)) == base {
			t.Errorf("a changed %s left the digest unchanged", what)
		}
	}
	for _, missing := range []func(*image.Config){
		func(c *image.Config) { c.Binary = nil },
		func(c *image.Config) { c.Settings = nil },
		func(c *image.Config) { c.License = "" },
	} {
		c := small
		missing(&c)
		if _, err := image.Build(c); err == nil {
			t.Errorf("Build with a missing input: no error")
		}
	}
}

type entry struct {
	hdr  *tar.Header
	data []byte
}

func layerEntries(t *testing.T, img v1.Image) []entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []entry
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, entry{h, b})
		}
		rc.Close()
	}
	return out
}

// TestImageContents: the image is what the Dockerfile describes — one
// layer on an empty base, entries sorted with fixed times, a numeric
// non-root user, no shell, CA certificates, the shipped configuration,
// OCI labels, and an environment the binary understands.
func TestImageContents(t *testing.T) {
	cfg := testConfig(t)
	img := shared(t)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != fmt.Sprintf("%d:%d", image.UID, image.GID) || image.UID == 0 {
		t.Errorf("user %q: want the numeric non-root %d:%d", cf.Config.User, image.UID, image.GID)
	}
	if want := []string{"/ratelimit-authz", "serve"}; !slices.Equal(cf.Config.Entrypoint, want) {
		t.Errorf("entrypoint %q, want %q", cf.Config.Entrypoint, want)
	}
	if !cf.Created.Equal(image.Epoch) || cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("created %v os %s arch %s", cf.Created, cf.OS, cf.Architecture)
	}
	for _, l := range []string{"org.opencontainers.image.version", "org.opencontainers.image.source", "org.opencontainers.image.licenses", "org.opencontainers.image.revision"} {
		if cf.Config.Labels[l] == "" {
			t.Errorf("label %s missing", l)
		}
	}
	if cf.Config.Labels["org.opencontainers.image.version"] != cfg.Version {
		t.Errorf("version label %q", cf.Config.Labels["org.opencontainers.image.version"])
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 1 || m.MediaType != "application/vnd.oci.image.manifest.v1+json" {
		t.Errorf("manifest %s with %d layers: want one OCI layer on an empty base", m.MediaType, len(m.Layers))
	}

	// Every environment variable the image sets is one the binary reads.
	surface, err := serverbin.Help(context.Background(), serverBin, "serve")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range cf.Config.Env {
		name, _, _ := strings.Cut(kv, "=")
		if !surface.Env[name] {
			t.Errorf("image env %s: not an environment variable of ratelimit-authz serve (%v)", name, surface.SortedEnv())
		}
	}

	entries := layerEntries(t, img)
	var names []string
	files := map[string]entry{}
	for _, e := range entries {
		names = append(names, e.hdr.Name)
		files[e.hdr.Name] = e
		if !e.hdr.ModTime.Equal(image.Epoch) || e.hdr.Uname != "" || e.hdr.Gname != "" {
			t.Errorf("%s: time %v owner %q/%q: want fixed", e.hdr.Name, e.hdr.ModTime, e.hdr.Uname, e.hdr.Gname)
		}
		if strings.HasPrefix(e.hdr.Name, "bin/") || strings.Contains(e.hdr.Name, "sh") && e.hdr.Mode&0o111 != 0 && e.hdr.Typeflag == tar.TypeReg {
			t.Errorf("%s: the image has no shell or tools", e.hdr.Name)
		}
	}
	if !slices.IsSorted(names) {
		t.Errorf("entries not sorted: %q", names)
	}
	bin, ok := files["ratelimit-authz"]
	if !ok || !bytes.Equal(bin.data, cfg.Binary) || bin.hdr.Mode != 0o755 || bin.hdr.Uid != 0 {
		t.Errorf("/ratelimit-authz missing, different or writable by its user")
	}
	if c, ok := files["etc/ratelimit-authz/ratelimit.yaml"]; !ok || !bytes.Equal(c.data, cfg.Settings) {
		t.Errorf("the shipped configuration is missing or different")
	}
	if p := files["etc/passwd"]; !strings.Contains(string(p.data), fmt.Sprintf(":%d:%d:", image.UID, image.GID)) {
		t.Errorf("/etc/passwd lacks the image user: %q", p.data)
	}
	ca, ok := files["etc/ssl/certs/ca-certificates.crt"]
	if !ok {
		t.Fatal("no CA certificates")
	}
	n := 0
	for rest := ca.data; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			t.Fatalf("CA certificate %d: %v", n, err)
		}
		n++
	}
	if n < 100 {
		t.Errorf("%d CA certificates: want the whole public trust store", n)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.data) {
		t.Error("crypto/x509 reads no certificate from the bundle")
	}
}

// unpack extracts the image's layers into root in order, as a container
// runtime does; a hostile entry (absolute, .., a link out) fails.
func unpack(t *testing.T, img v1.Image, root string) {
	t.Helper()
	for _, e := range layerEntries(t, img) {
		name := path.Clean(e.hdr.Name)
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			t.Fatalf("layer entry %q escapes the root", e.hdr.Name)
		}
		dst := filepath.Join(root, filepath.FromSlash(name))
		mode := os.FileMode(e.hdr.Mode & 0o777)
		switch e.hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.WriteFile(dst, e.data, mode); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("layer entry %q: type %c not expected in this image", e.hdr.Name, e.hdr.Typeflag)
		}
		// Modes with sticky bits, and owners, as the tar says.
		m := mode
		if e.hdr.Mode&0o1000 != 0 {
			m |= os.ModeSticky
		}
		if err := os.Chmod(dst, m); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(dst, e.hdr.Uid, e.hdr.Gid); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUnpackedImageServes writes the image as `make image` does, reads it
// back from the OCI layout, unpacks its layers into a root filesystem and
// runs its entrypoint there (chroot) as the image's user with the image's
// environment (the listen addresses moved to free loopback ports, as
// `docker run -e` would): /readyz and /healthz answer, the binary's own
// probe run in the image answers for a container health check, and
// Checks are decided — allowed, then denied with 429 and Retry-After.
func TestUnpackedImageServes(t *testing.T) {
	if os.Geteuid() != 0 {
		msg := "chroot and setuid need root (uid %d)"
		if os.Getenv("CI") == "true" {
			t.Fatalf(msg, os.Geteuid())
		}
		t.Skipf(msg, os.Geteuid())
	}
	cfg := testConfig(t)
	dir := t.TempDir()
	lp := filepath.Join(dir, "layout")
	if err := image.WriteLayout(lp, cfg.Version, shared(t), image.Labels(cfg)); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(lp)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("layout index: %v, %d manifests", err, len(im.Manifests))
	}
	if ref := im.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; ref != cfg.Version {
		t.Errorf("layout ref name %q, want %q", ref, cfg.Version)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}

	root := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	unpack(t, img, root)

	var uid, gid uint32
	if _, err := fmt.Sscanf(cf.Config.User, "%d:%d", &uid, &gid); err != nil {
		t.Fatalf("image user %q: %v", cf.Config.User, err)
	}
	addrs, err := freeport.Addrs(3)
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr, checkAddr, httpAddr := addrs[0], addrs[1], addrs[2]
	env := append(slices.Clone(cf.Config.Env),
		"RATELIMIT_AUTHZ_GRPC_ADDR="+grpcAddr,
		"RATELIMIT_AUTHZ_CHECK_ADDR="+checkAddr,
		"RATELIMIT_AUTHZ_HTTP_ADDR="+httpAddr,
		"RATELIMIT_AUTHZ_DRAIN_DELAY=100ms",
	)
	logPath := filepath.Join(dir, "server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := &exec.Cmd{
		Path:   cf.Config.Entrypoint[0], // resolved inside the chroot
		Args:   append(slices.Clone(cf.Config.Entrypoint), cf.Config.Cmd...),
		Env:    env,
		Dir:    cf.Config.WorkingDir,
		Stdout: logf,
		Stderr: logf,
		SysProcAttr: &syscall.SysProcAttr{
			Chroot:     root,
			Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}},
			Setpgid:    true,
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the entrypoint in the unpacked image: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		if err := syscall.Kill(cmd.Process.Pid, syscall.SIGTERM); err != nil {
			return err
		}
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			<-done
			return errors.New("ignored SIGTERM for 20 s: killed")
		}
	}
	t.Cleanup(func() { stop() })
	logTail := func() string { return proc.Tail(logPath, 30) }

	if err := proc.WaitHTTP200(ctx, "http://"+httpAddr+"/readyz"); err != nil {
		t.Fatalf("/readyz: %v\n%s", err, logTail())
	}
	if err := proc.WaitHTTP200(ctx, "http://"+httpAddr+"/healthz"); err != nil {
		t.Fatalf("/healthz: %v\n%s", err, logTail())
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("Uid:\t%d\t%d\t%d\t%d", uid, uid, uid, uid); !strings.Contains(string(status), want) {
		t.Errorf("the server does not run as the image's user: want %q in\n%s", want, status)
	}

	// The health check of a container without a shell: the binary's own
	// probe, run inside the image as its user (as Docker's CMD check is).
	probe := func(url string) (int, string) {
		t.Helper()
		var out bytes.Buffer
		pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
		defer pcancel()
		pc := exec.CommandContext(pctx, cf.Config.Entrypoint[0], "probe", "--url", url) // resolved inside the chroot
		pc.Env, pc.Dir, pc.Stdout, pc.Stderr = env, cf.Config.WorkingDir, &out, &out
		pc.SysProcAttr = &syscall.SysProcAttr{
			Chroot:     root,
			Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}},
			Pdeathsig:  syscall.SIGKILL,
		}
		err := pc.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("probe in the image: %v", err)
		}
		return pc.ProcessState.ExitCode(), out.String()
	}
	if code, out := probe("http://" + httpAddr + "/readyz"); code != 0 || !strings.Contains(out, "200 OK") {
		t.Errorf("probe of the ready node in the image: exit %d %q", code, out)
	}
	if code, out := probe("http://" + grpcAddr + "/readyz"); code != 1 || !strings.Contains(out, "ratelimit-authz probe: GET") {
		t.Errorf("probe of the gRPC port (no /readyz there) in the image: exit %d %q, want 1 and a reason", code, out)
	}

	serverbin.AwayFromMinuteEdge()
	allowed, denial, err := serverbin.DenyToken(ctx, grpcAddr, "203.0.113.77", 1000)
	if err != nil {
		t.Fatalf("checks: %v\n%s", err, logTail())
	}
	if allowed == 0 || denial.HTTPStatus != 429 || denial.RetryAfter == "" {
		t.Errorf("%d allowed, then %+v: want some allowed, then 429 with Retry-After", allowed, denial)
	}
	t.Logf("unpacked image: /readyz 200, %d checks allowed, then HTTP %d Retry-After %s", allowed, denial.HTTPStatus, denial.RetryAfter)

	// The lean Check listener the image opens (Envoy's ext_authz target)
	// decides too, for another client.
	allowed, denial, err = serverbin.DenyToken(ctx, checkAddr, "203.0.113.78", 1000)
	if err != nil {
		t.Fatalf("checks on the lean Check listener: %v\n%s", err, logTail())
	}
	if allowed == 0 || denial.HTTPStatus != 429 || denial.RetryAfter == "" {
		t.Errorf("lean Check listener: %d allowed, then %+v: want some allowed, then 429 with Retry-After", allowed, denial)
	}

	if err := stop(); err != nil {
		t.Errorf("graceful stop: %v\n%s", err, logTail())
	}
}
