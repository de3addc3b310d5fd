package envoyconf

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The names in the shipped bootstrap that WithListeners and
// WithAuthzCluster copy.
const (
	ShippedListenerName = "ingress"               // the one listener
	ShippedAuthzCluster = "ratelimit_authz"       // the ratelimit-authz nodes' gRPC port: the failure access log's cluster
	ShippedCheckCluster = "ratelimit_authz_check" // the nodes' lean Check listener: the ext_authz filter's cluster
)

// Listener is one listener of a rendered bootstrap: a copy of the shipped
// listener (its connection manager, routes, failure access log and HTTP
// filters) with a name, an address and a check cluster of its own. The
// failure access log keeps sending to ShippedAuthzCluster: the gRPC port
// is the one that serves the access-log service.
type Listener struct {
	// Name names the listener and is its stat_prefix, so its filter's
	// stats are http.<Name>.ext_authz.*.
	Name string
	// Addr is where clients connect: host:port with an IP literal host.
	Addr string
	// Authz is the cluster the listener's ext_authz filter sends its
	// checks to: ShippedCheckCluster (as shipped), ShippedAuthzCluster
	// (the gRPC port), or one added by WithAuthzCluster. Empty: the
	// listener has no ext_authz filter at all, which is Envoy without
	// rate limiting, the baseline a measurement of the filter's cost
	// compares with.
	Authz string
}

// validName is what a listener or cluster name may be: it is written into
// YAML and into Envoy's stat names.
var validName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,59}$`)

// extAuthzFilter opens the ext_authz entry of the shipped HTTP filter chain.
const extAuthzFilter = "          - name: envoy.filters.http.ext_authz"

// listenerAddress opens the line that holds the shipped listener's address.
const listenerAddress = "    address: { socket_address: { "

// WithListeners returns the rendered bootstrap cfg with its one listener
// replaced by a copy for each of ls, in order. Each copy keeps everything
// of the shipped listener but its name, stat_prefix, address and, per
// Listener.Authz, the cluster its checks go to. Add the clusters the
// listeners name first (WithAuthzCluster): a listener naming a cluster the
// bootstrap lacks is an error.
func WithListeners(cfg []byte, ls ...Listener) ([]byte, error) {
	if len(ls) == 0 {
		return nil, errors.New("envoyconf: no listener")
	}
	s := string(cfg)
	start, end, err := block(s, "  - name: "+ShippedListenerName)
	if err != nil {
		return nil, err
	}
	shipped := s[start:end]
	seen := map[string]bool{}
	var b strings.Builder
	b.WriteString(s[:start])
	for _, l := range ls {
		if !validName.MatchString(l.Name) {
			return nil, fmt.Errorf("envoyconf: listener name %q: want lowercase letters, digits and _ (at most 60), starting with a letter", l.Name)
		}
		if seen[l.Name] {
			return nil, fmt.Errorf("envoyconf: listener %q twice", l.Name)
		}
		seen[l.Name] = true
		out, err := copyListener(s, shipped, l)
		if err != nil {
			return nil, fmt.Errorf("envoyconf: listener %q: %w", l.Name, err)
		}
		b.WriteString(out)
	}
	b.WriteString(s[end:])
	return []byte(b.String()), nil
}

// copyListener returns the shipped listener block as l; all is the whole
// bootstrap, to look the cluster up in.
func copyListener(all, shipped string, l Listener) (string, error) {
	sa, err := socketAddress(l.Addr)
	if err != nil {
		return "", err
	}
	out, err := replaceOnce(shipped, "  - name: "+ShippedListenerName+"\n", "  - name: "+quote(l.Name)+"\n")
	if err != nil {
		return "", err
	}
	if out, err = replaceOnce(out, "stat_prefix: "+ShippedListenerName+"\n", "stat_prefix: "+quote(l.Name)+"\n"); err != nil {
		return "", err
	}
	if out, err = replaceLine(out, listenerAddress, listenerAddress+sa+" }"); err != nil {
		return "", err
	}
	// The ext_authz filter's cluster, which occurs once in the listener.
	ref := "cluster_name: " + ShippedCheckCluster + " }"
	if n := strings.Count(out, ref); n != 1 {
		return "", fmt.Errorf("%w: %q occurs %d times in the listener", ErrPlaceholder, ref, n)
	}
	if l.Authz == "" {
		start, end, err := block(out, extAuthzFilter)
		if err != nil {
			return "", err
		}
		return out[:start] + out[end:], nil
	}
	if !validName.MatchString(l.Authz) {
		return "", fmt.Errorf("cluster name %q: want lowercase letters, digits and _, starting with a letter", l.Authz)
	}
	if !hasCluster(all, l.Authz) {
		return "", fmt.Errorf("no cluster %q in the bootstrap (add it with WithAuthzCluster first)", l.Authz)
	}
	if l.Authz == ShippedCheckCluster {
		return out, nil
	}
	return strings.Replace(out, ref, "cluster_name: "+quote(l.Authz)+" }", 1), nil
}

// WithAuthzCluster returns the rendered bootstrap cfg with one more check
// cluster, name, beside ratelimit_authz: a copy of it (HTTP/2, timeouts,
// circuit breakers, health checks) whose endpoints are addrs, each
// host:port with an IP literal host. Listeners send to it by
// Listener.Authz.
func WithAuthzCluster(cfg []byte, name string, addrs ...string) ([]byte, error) {
	if !validName.MatchString(name) {
		return nil, fmt.Errorf("envoyconf: cluster name %q: want lowercase letters, digits and _ (at most 60), starting with a letter", name)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("envoyconf: cluster %q: no address", name)
	}
	s := string(cfg)
	if hasCluster(s, name) {
		return nil, fmt.Errorf("envoyconf: cluster %q is already in the bootstrap", name)
	}
	start, end, err := block(s, "  - name: "+ShippedAuthzCluster)
	if err != nil {
		return nil, err
	}
	c := s[start:end]
	if c, err = replaceOnce(c, "  - name: "+ShippedAuthzCluster+"\n", "  - name: "+quote(name)+"\n"); err != nil {
		return nil, err
	}
	if c, err = replaceOnce(c, "cluster_name: "+ShippedAuthzCluster+"\n", "cluster_name: "+quote(name)+"\n"); err != nil {
		return nil, err
	}
	if c, err = endpoints(c, addrs); err != nil {
		return nil, fmt.Errorf("envoyconf: cluster %q: %w", name, err)
	}
	return []byte(s[:end] + c + s[end:]), nil
}

// endpointLine opens a one-line lb_endpoints entry.
const endpointLine = "- endpoint: { address: { socket_address: { "

// endpoints replaces the one-line endpoint entries of cluster block c by
// one per address, at the first entry's place and indentation.
func endpoints(c string, addrs []string) (string, error) {
	lines := strings.SplitAfter(c, "\n")
	var out []string
	done := false
	for _, line := range lines {
		trimmed := strings.TrimLeft(line, " ")
		if !strings.HasPrefix(trimmed, endpointLine) {
			out = append(out, line)
			continue
		}
		if done {
			continue
		}
		done = true
		indent := line[:len(line)-len(trimmed)]
		for _, a := range addrs {
			sa, err := socketAddress(a)
			if err != nil {
				return "", err
			}
			out = append(out, indent+endpointLine+sa+" } }\n")
		}
	}
	if !done {
		return "", fmt.Errorf("%w: no one-line %q entry to copy", ErrPlaceholder, strings.TrimSpace(endpointLine))
	}
	return strings.Join(out, ""), nil
}

// block finds the lines that start at the line header (which must occur
// exactly once, as a whole line) and end before the next line, not blank,
// indented no deeper than header: one item of a YAML sequence with its
// comments.
func block(s, header string) (start, end int, err error) {
	line := header + "\n"
	if n := strings.Count(s, "\n"+line); n != 1 {
		return 0, 0, fmt.Errorf("%w: line %q occurs %d times", ErrPlaceholder, header, n)
	}
	start = strings.Index(s, "\n"+line) + 1
	depth := len(header) - len(strings.TrimLeft(header, " "))
	end = start + len(line)
	for end < len(s) {
		next := strings.IndexByte(s[end:], '\n')
		l := s[end:]
		if next >= 0 {
			l = s[end : end+next]
		}
		if t := strings.TrimLeft(l, " "); t != "" && len(l)-len(t) <= depth {
			break
		}
		if next < 0 {
			end = len(s)
			break
		}
		end += next + 1
	}
	return start, end, nil
}

// replaceOnce replaces old, which must occur exactly once in s.
func replaceOnce(s, old, repl string) (string, error) {
	if n := strings.Count(s, old); n != 1 {
		return "", fmt.Errorf("%w: %q occurs %d times", ErrPlaceholder, strings.TrimSpace(old), n)
	}
	return strings.Replace(s, old, repl, 1), nil
}

// replaceLine replaces the one line of s that starts with prefix by line.
func replaceLine(s, prefix, line string) (string, error) {
	if n := strings.Count(s, "\n"+prefix); n != 1 {
		return "", fmt.Errorf("%w: a line starting %q occurs %d times", ErrPlaceholder, prefix, n)
	}
	i := strings.Index(s, "\n"+prefix) + 1
	j := strings.IndexByte(s[i:], '\n')
	if j < 0 {
		return s[:i] + line, nil
	}
	return s[:i] + line + s[i+j:], nil
}

// hasCluster reports whether the bootstrap s has a static cluster name,
// as shipped or as WithAuthzCluster writes it.
func hasCluster(s, name string) bool {
	i := strings.Index(s, "\n  clusters:\n")
	if i < 0 {
		return false
	}
	s = s[i:]
	return strings.Contains(s, "\n  - name: "+name+"\n") || strings.Contains(s, "\n  - name: "+quote(name)+"\n")
}

// quote writes a name as a YAML string that never reads as a boolean or a
// number (Envoy's YAML reads a plain on, off or yes as one).
func quote(name string) string { return strconv.Quote(name) }
