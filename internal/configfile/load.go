package configfile

import (
	"errors"
	"io/fs"
	"os"

	"github.com/ratelimit-authz/ratelimit-authz/config"
)

// File is where the rules are read: Path, or, when no file is there and
// it was not asked for (Explicit false: the default path), the shipped
// default (package config), so that a server runs with no file at hand.
type File struct {
	Path     string
	Explicit bool
}

// Load reads and parses the rules f names, and returns the name of what
// it read: f.Path, or config.Name for the shipped default.
func (f File) Load() (*Rules, string, error) {
	if f.Shipped() {
		r, err := Parse(config.Default(), config.Name)
		return r, config.Name, err
	}
	r, err := LoadFile(f.Path)
	return r, f.Path, err
}

// Shipped reports whether f reads the shipped default now: no file is at
// the default path.
func (f File) Shipped() bool {
	if f.Explicit {
		return false
	}
	_, err := os.Stat(f.Path)
	return errors.Is(err, fs.ErrNotExist)
}
