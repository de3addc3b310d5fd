package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
)

// shippedConfig is the server configuration the benchmarks start from.
const shippedConfig = "config/ratelimit.yaml"

// roomyLimit is a limit no benchmark reaches: every check takes the
// counting path and is allowed.
const roomyLimit = 2_000_000_000

// editConfig applies edit to the YAML tree of the shipped configuration
// (comments and order kept), checks the result with the server's own
// parser, and writes it to out.
func editConfig(root, out string, edit func(top *yaml.Node) error) error {
	data, err := os.ReadFile(filepath.Join(root, shippedConfig))
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("%s: %w", shippedConfig, err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("%s: not a mapping", shippedConfig)
	}
	if err := edit(doc.Content[0]); err != nil {
		return fmt.Errorf("edit %s: %w", shippedConfig, err)
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	return writeChecked(out, b.Bytes())
}

// writeChecked validates a configuration as the server would and writes
// it.
func writeChecked(out string, data []byte) error {
	if _, err := configfile.Parse(data, out); err != nil {
		return fmt.Errorf("generated configuration %s is invalid: %w", out, err)
	}
	return os.WriteFile(out, data, 0o644)
}

// mapValue returns the value node of key in mapping m, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// setScalar sets key in mapping m to value, adding the key if missing.
func setScalar(m *yaml.Node, key, value string) error {
	if m == nil || m.Kind != yaml.MappingNode {
		return fmt.Errorf("no mapping to set %s in", key)
	}
	if v := mapValue(m, key); v != nil {
		v.Kind, v.Tag, v.Value, v.Style = yaml.ScalarNode, "", value, 0
		return nil
	}
	m.Content = append(m.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Value: value})
	return nil
}

// writeAllowedConfig writes the shipped configuration with every request
// bucket's limit out of reach: the "allowed" workload.
func writeAllowedConfig(root, out string) error { return editConfig(root, out, allowAll) }

// allowAll sets every request bucket's limit out of reach.
func allowAll(top *yaml.Node) error {
	buckets := mapValue(top, "buckets")
	if buckets == nil || buckets.Kind != yaml.MappingNode {
		return fmt.Errorf("no buckets")
	}
	for i := 1; i < len(buckets.Content); i += 2 {
		b := buckets.Content[i]
		if c := mapValue(b, "count"); c != nil && c.Value == "failures" {
			continue // login buckets only peek; keep them as shipped
		}
		if err := setScalar(b, "limit", strconv.Itoa(roomyLimit)); err != nil {
			return err
		}
	}
	return nil
}

// costHeader is the response header the cost configuration's buckets
// charge from, as config/examples/llm-budget.yaml's token budget does.
const costHeader = "x-usage-total-tokens"

// writeCostConfig writes the allowed configuration with every request
// bucket a budget charged after the response from costHeader, and no
// quota section: the Check peeks at each instead of counting, and the
// access log charges them.
func writeCostConfig(root, out string) error {
	return editConfig(root, out, func(top *yaml.Node) error {
		if err := allowAll(top); err != nil {
			return err
		}
		buckets := mapValue(top, "buckets")
		for i := 1; i < len(buckets.Content); i += 2 {
			b := buckets.Content[i]
			if c := mapValue(b, "count"); c != nil && c.Value == "failures" {
				continue
			}
			var cost yaml.Node
			if err := yaml.Unmarshal([]byte("{response_header: "+costHeader+", max: 4000}"), &cost); err != nil {
				return err
			}
			b.Content = append(b.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "cost"}, cost.Content[0])
		}
		// RLQS cannot carry a response's cost: its section goes (this
		// configuration serves Check).
		for i := 0; i+1 < len(top.Content); i += 2 {
			if top.Content[i].Value == "quota" {
				top.Content = append(top.Content[:i], top.Content[i+2:]...)
				break
			}
		}
		return nil
	})
}

// writeMemoryConfig writes the shipped configuration with the token_create
// bucket (per client IP) on a window of the given length, copies of it
// (token_create_2 …) so that the legacy token route counts each check in
// `copies` buckets, and room for maxKeys live keys. Every (bucket, key) is
// a live key of its own, with its own entry, table slot and key bytes, so
// a check that brings n new keys costs the memory of n checks that bring
// one each; it only takes fewer checks to reach a million.
func writeMemoryConfig(root, out string, window time.Duration, copies, maxKeys int) error {
	return editConfig(root, out, func(top *yaml.Node) error {
		if err := setScalar(mapValue(top, "counter"), "max_keys", strconv.Itoa(maxKeys)); err != nil {
			return err
		}
		buckets := mapValue(top, "buckets")
		tc := mapValue(buckets, "token_create")
		if tc == nil {
			return fmt.Errorf("no token_create bucket")
		}
		if err := setScalar(tc, "per", window.String()); err != nil {
			return err
		}
		names := []string{"token_create"}
		for i := 2; i <= copies; i++ {
			name := fmt.Sprintf("token_create_%d", i)
			names = append(names, name)
			var cp yaml.Node
			b, err := yaml.Marshal(tc)
			if err != nil {
				return err
			}
			if err := yaml.Unmarshal(b, &cp); err != nil {
				return err
			}
			buckets.Content = append(buckets.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: name}, cp.Content[0])
		}
		routes := mapValue(top, "routes")
		if routes == nil || routes.Kind != yaml.SequenceNode {
			return fmt.Errorf("no routes")
		}
		for _, rt := range routes.Content {
			if p := mapValue(rt, "path"); p == nil || p.Value != "/api/v1/tokens" {
				continue
			}
			seq := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
			for _, n := range names {
				seq.Content = append(seq.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: n})
			}
			for i := 0; i+1 < len(rt.Content); i += 2 {
				if rt.Content[i].Value == "buckets" {
					rt.Content[i+1] = seq
					return nil
				}
			}
		}
		return fmt.Errorf("no route for /api/v1/tokens")
	})
}

func commandOutput(ctx context.Context, dir, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// checkout writes the tree of ref into a new folder under the run's
// temporary folder (git archive: no worktree is added to the repository)
// and returns the folder and the commit.
func (r *runner) checkout(ctx context.Context, ref, name string) (src, commit string, err error) {
	commit, err = commandOutput(ctx, r.root, "git", "rev-parse", "--verify", "--end-of-options", ref+"^{commit}")
	if err != nil {
		return "", "", fmt.Errorf("git rev-parse %s: %w (not in this clone?)", ref, err)
	}
	if src, err = os.MkdirTemp(r.tmp, name+"-"); err != nil {
		return "", commit, err
	}
	_, err = r.runTool(ctx, name+"-archive", 2*time.Minute, nil, r.root, "bash", "-c",
		`set -euo pipefail; git archive --format=tar "$1" | tar -x -C "$2"`, "bash", commit, src)
	return src, commit, err
}

// goBuild builds the package pkg of the module at dir into the binary out.
func (r *runner) goBuild(ctx context.Context, dir, out, pkg string) error {
	_, err := r.runTool(ctx, "build-"+filepath.Base(out), 5*time.Minute, []string{"CGO_ENABLED=0"}, dir, "go", "build", "-trimpath", "-o", out, pkg)
	return err
}
