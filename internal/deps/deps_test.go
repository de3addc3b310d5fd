package deps_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

const module = "github.com/ratelimit-authz/ratelimit-authz/"

// configSide is configuration and wire decoding: what check-config, the
// CLI and the fuzzers load, and what a node compiles before it serves.
var configSide = []string{"internal/configfile", "internal/rlsconfig", "internal/problem", "internal/limits", "internal/snapshot", "internal/checkwire", "internal/checkreq", "internal/match", "internal/counter"}

// servingSide is what talks to the network or a database: drivers, NATS,
// gRPC, the front ends and the packages that assemble them. Module
// packages are written without the module path.
var servingSide = []string{
	"github.com/jackc/pgx", "github.com/nats-io/nats.go", "google.golang.org/grpc",
	"internal/authz", "internal/checkgrpc", "internal/rls", "internal/rlqs", "internal/accesslog", "internal/checkh2", "internal/node", "internal/server", "internal/replicate",
	"internal/overridedb", "internal/overrides",
}

// A rule forbids each package of from to depend, directly or not, on any
// package of to (a path and everything below it).
type rule struct {
	name     string
	from, to []string
	why      string
}

var rules = []rule{{
	name: "configuration and wire decoding need no server",
	from: configSide, to: servingSide,
	why: "they are loaded and checked where nothing serves (check-config, the limits CLI, fuzzers) and sit below every front end; a dependency on a driver or a front end would turn the layering around",
}, {
	name: "the counter knows nothing of replication",
	from: []string{"internal/counter"}, to: []string{"internal/replicate"},
	why: "replication is built on the counter's hooks, never the other way",
}, {
	name: "the budget-sharing policy is a leaf",
	from: []string{"internal/share"}, to: []string{module + "internal"},
	why: "it is arithmetic that the counter, replication and RLQS call; a dependency on any package of the server would put it above one of them",
}, {
	name: "wire decoding does not depend on route matching",
	from: []string{"internal/checkwire"}, to: []string{"internal/match"},
	why: "the decoder reads bytes into a request; matching routes is what a consumer of that request does",
}, {
	name: "route matching knows nothing of counting",
	from: []string{"internal/match"}, to: []string{"internal/counter"},
	why: "a route names its buckets by their index in the matcher's configuration; the counter's bucket type is a counter id, which only the snapshot assigns",
}, {
	name: "the two configuration formats are independent",
	from: []string{"internal/rlsconfig"}, to: []string{"internal/configfile"},
	why: "envoyproxy/ratelimit's descriptor files and the rules file are separate sources; neither needs the other's parser",
}}

// An exception is a dependency a rule forbids that the code still has,
// with the reason and the work that removes it. The test fails when one
// is no longer needed.
type exception struct {
	from, to string
	why      string
}

var exceptions = []exception{}

func TestDependenciesPointOneWay(t *testing.T) {
	var from []string
	for _, r := range rules {
		from = append(from, r.from...)
	}
	g := importGraph(t, from)
	used := make([]bool, len(exceptions))
	for _, r := range rules {
		var broken []string
		for _, f := range r.from {
			for _, to := range r.to {
				chain := g.pathTo(full(f), full(to))
				if chain == nil {
					continue
				}
				if i := excepted(f, to); i >= 0 {
					used[i] = true
					continue
				}
				broken = append(broken, strings.Join(chain, " → "))
			}
		}
		if broken != nil {
			t.Errorf("%s: %s\n\t%s", r.name, r.why, strings.Join(broken, "\n\t"))
		}
	}
	for i, e := range exceptions {
		if !used[i] {
			t.Errorf("the exception %s → %s matches no forbidden dependency: remove it from internal/deps (it was: %s)", e.from, e.to, e.why)
		}
	}
}

func excepted(from, to string) int {
	for i, e := range exceptions {
		if e.from == from && e.to == to {
			return i
		}
	}
	return -1
}

// full is the import path of a module package, or p as given.
func full(p string) string {
	if strings.HasPrefix(p, "internal/") {
		return module + p
	}
	return p
}

// graph is the direct imports of every package the listed ones need.
type graph map[string][]string

// importGraph reads the non-test imports of pkgs and all they depend on.
// A package that does not exist fails the test, so that a rule cannot
// silently stop applying.
func importGraph(t *testing.T, pkgs []string) graph {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	args := []string{"list", "-deps", "-json=ImportPath,Imports"}
	for _, p := range pkgs {
		args = append(args, full(p))
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	g := graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		g[p.ImportPath] = p.Imports
	}
	for _, p := range pkgs {
		if _, ok := g[full(p)]; !ok {
			t.Fatalf("go list did not report %s", p)
		}
	}
	return g
}

// generated are Envoy's generated API packages. Each holds a service's
// messages beside its gRPC stubs, so importing a message (a CheckRequest)
// imports grpc: a chain through them is the messages', never a server's,
// and the rules do not follow their imports.
var generated = []string{"github.com/envoyproxy/go-control-plane/"}

// pathTo returns a shortest chain of imports from the package from to a
// package at or below to, or nil when there is none; the imports of the
// generated packages are not followed.
func (g graph) pathTo(from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p != from && (p == to || strings.HasPrefix(p, to+"/")) {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append(chain, strings.TrimPrefix(p, module))
			}
			for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
				chain[i], chain[j] = chain[j], chain[i]
			}
			return chain
		}
		if p != from && slices.ContainsFunc(generated, func(gen string) bool { return strings.HasPrefix(p, gen) }) {
			continue
		}
		for _, q := range g[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}
