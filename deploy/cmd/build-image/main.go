// Command build-image writes the ratelimit-authz container image without a
// container engine (`make image`): an OCI image layout and a tarball for
// `docker load`, reproducibly (the same inputs give the same digest).
//
//	build-image --binary bin/ratelimit-authz --config config/ratelimit.yaml \
//	  --version v1.2.3 --revision COMMIT --layout bin/image --tarball bin/ratelimit-authz-image.tar
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/ratelimit-authz/ratelimit-authz/deploy/image"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "build-image:", err)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("build-image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	binary := fs.String("binary", "bin/ratelimit-authz", "the static server binary (make build)")
	settings := fs.String("config", "config/ratelimit.yaml", "the configuration file shipped in the image")
	version := fs.String("version", "dev", "image version (label and tag)")
	revision := fs.String("revision", "", "source commit (label)")
	source := fs.String("source", "https://github.com/ratelimit-authz/ratelimit-authz", "source repository URL (label)")
	license := fs.String("license", "NOASSERTION", "SPDX licence expression (label)")
	arch := fs.String("arch", runtime.GOARCH, "GOARCH the binary was built for")
	repo := fs.String("name", "ratelimit-authz", "image name for the tag")
	layoutDir := fs.String("layout", "bin/image", "OCI image layout folder to write (must not exist); empty: none")
	tarFile := fs.String("tarball", "bin/ratelimit-authz-image.tar", "docker-load tarball to write; empty: none")
	layerTar := fs.String("layer-tar", "", "also write the image's root filesystem as an uncompressed tar (for the Dockerfile); empty: none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	bin, err := os.ReadFile(*binary)
	if err != nil {
		return fmt.Errorf("read the binary: %w", err)
	}
	conf, err := os.ReadFile(*settings)
	if err != nil {
		return fmt.Errorf("read the configuration: %w", err)
	}
	cfg := image.Config{Binary: bin, Settings: conf, Version: *version, Revision: *revision, Source: *source, License: *license, Arch: *arch}
	if *layerTar != "" {
		b, err := image.LayerTar(cfg)
		if err != nil {
			return err
		}
		if err := os.WriteFile(*layerTar, b, 0o644); err != nil {
			return fmt.Errorf("write the layer: %w", err)
		}
	}
	img, err := image.Build(cfg)
	if err != nil {
		return err
	}
	if *layoutDir != "" {
		if err := image.WriteLayout(*layoutDir, *version, img, image.Labels(cfg)); err != nil {
			return err
		}
	}
	if *tarFile != "" {
		if err := image.WriteTarball(*tarFile, *repo+":"+*version, img); err != nil {
			return err
		}
	}
	d, err := img.Digest()
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	fmt.Fprintf(stdout, "%s:%s %s\n", *repo, *version, d)
	return nil
}
