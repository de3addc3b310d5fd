// Package config carries the shipped configuration, ratelimit.yaml, inside
// the binary, so that `ratelimit-authz serve` runs with no file at hand.
package config

import _ "embed"

// A string, not a []byte: nothing can change the shipped default at run time.
//
//go:embed ratelimit.yaml
var shipped string

// Name is what problems in the shipped configuration are reported against.
const Name = "(embedded)config/ratelimit.yaml"

// Default returns the shipped configuration file.
func Default() []byte { return []byte(shipped) }
