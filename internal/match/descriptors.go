package match

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// KeyKind says where a bucket's key comes from.
type KeyKind uint8

const (
	// KeyTenant is the value of Config.TenantHeader.
	KeyTenant KeyKind = iota
	// KeyIP is the trusted client IP (Result.ClientIP).
	KeyIP
	// KeyAccount is the login account: Config.AccountHeader, else the
	// Config.AccountBodyField of a form-urlencoded or JSON body; trimmed and
	// lower-cased.
	KeyAccount
	// KeyPathParam is a {name} capture of the route template; KeySpec.Name
	// is the capture name.
	KeyPathParam
	// KeyHeader is a request header; KeySpec.Name is its lowercase name.
	KeyHeader
)

func (k KeyKind) String() string {
	switch k {
	case KeyTenant:
		return "tenant"
	case KeyIP:
		return "ip"
	case KeyAccount:
		return "account"
	case KeyPathParam:
		return "path param"
	case KeyHeader:
		return "header"
	}
	return fmt.Sprintf("KeyKind(%d)", uint8(k))
}

// KeySpec says where a bucket's key comes from. Name is used by
// KeyPathParam and KeyHeader and ignored otherwise.
type KeySpec struct {
	Kind KeyKind
	Name string
}

// Bucket is one budget. Its index in Config.Buckets is its identity in
// Route.Buckets and Descriptor.Bucket.
type Bucket struct {
	Name string // unique, non-empty; Envoy's ratelimit_buckets refers to it
	Key  KeySpec
}

// Route is one route rule: the requests it matches and the buckets they
// spend from.
type Route struct {
	Name     string // optional; Envoy's ratelimit_route refers to it. Routes may share a name (one rule, several templates)
	Method   string // "" = any method; else an uppercase HTTP method
	Template string // e.g. "/api/inbound/{channel}/status"; see ValidateTemplate
	Buckets  []int  // indexes into Config.Buckets, each at most once; none = the route exempts what it matches
}

// Config is what New compiles.
type Config struct {
	Buckets                  []Bucket
	Routes                   []Route
	TenantHeader             string // lowercase, e.g. "x-tenant-id"; required when a bucket keys by tenant
	AccountHeader            string // lowercase, e.g. "x-login-account"; "" = none
	AccountBodyField         string // e.g. "email"; "" = none
	TrustedHops              int    // = Envoy HCM xff_num_trusted_hops; 0 = the peer address
	UseExternalAddressHeader bool   // trust x-envoy-external-address when present (Envoy sets it with use_remote_address: true)
	// IPv6Prefix is the prefix length an IPv6 client is keyed by in
	// ip-keyed buckets: 0 means 64, 128 means per address. IPv4 clients
	// (IPv4-mapped IPv6 included) are keyed per address.
	IPv6Prefix int
	// CostHeaders are headers the caller reads itself (a bucket's cost,
	// such as content-length): HeaderNames lists them too, so that a
	// decoder keeps them. Each is a lowercase header name.
	CostHeaders []string
}

// Descriptor is one bucket that applies to a request, and its key.
type Descriptor struct {
	Bucket int    // index into Config.Buckets
	Key    string // "" when the request lacks the key: apply the missing-key policy, never count it under a shared empty key
}

// Result is what Describe found.
type Result struct {
	// Route is the index of the route that applies (matched, or named by
	// ratelimit_route) or that supplied the path params of the buckets named
	// by ratelimit_buckets; -1 when none did. Descriptors can be non-empty
	// with Route -1 (ratelimit_buckets and no template matching the path).
	Route int
	// Descriptors is the dst passed to Describe with one descriptor per
	// applicable bucket appended, in the route's (or the list's) order.
	Descriptors []Descriptor
	// ClientIP is the trusted client address in canonical form, or "" when
	// even the TCP peer is not an IP address.
	ClientIP string
	// Account is the first normalised login account the request presents;
	// only computed when a bucket in Descriptors keys by account, "" otherwise
	// or when it presents none that can be read.
	Account string
	// AccountUnreadable is set when a bucket in Descriptors keys by account
	// and the request names no account, or one that cannot be read, or more
	// than MaxAccounts: such buckets then also have a descriptor keyed
	// UnreadableAccount.
	AccountUnreadable bool
	// UnknownBuckets counts the names in ratelimit_buckets that name no
	// bucket; they were skipped.
	UnknownBuckets int
	// UnknownRoute is set when ratelimit_route names no route; the request
	// was then matched by its path as if the extension were absent.
	UnknownRoute bool
	// PathTooLong is set when the path without its query string exceeds
	// 8 KiB; it was matched against no template (Route is -1 unless
	// ratelimit_route named one).
	PathTooLong bool
}

// Engine turns requests into descriptors. It is immutable after New and safe
// for concurrent use. The zero Engine has no buckets and no routes: every
// request gets no descriptors and only its client IP (the TCP peer).
type Engine struct {
	buckets      []Bucket
	routes       []route
	byFirst      map[string][]int // first literal segment → candidate routes, in config order
	anyFirst     []int            // routes whose first segment is a capture
	bucketByName map[string]int
	routeByName  map[string][]int // in config order

	costHeaders []string
	headerNames []string // every header Describe reads, and costHeaders, each once
	wantsBody   bool

	tenantHeader  string
	accountHeader string
	accountField  string
	trustedHops   int
	useExternal   bool
	ipv6Prefix    int
}

type route struct {
	name         string
	method       string
	tpl          template
	buckets      []int
	paramSeg     []int // per bucket: the segment its path param key comes from, -1 if none
	needsAccount bool
}

// New validates cfg and compiles it. It reports every problem at once
// (errors.Join), each naming the route or bucket (index and name) and what
// is wrong with it.
func New(cfg Config) (*Engine, error) {
	var p problems
	checkKeys(cfg, &p)
	e := &Engine{
		costHeaders:   slices.Clone(cfg.CostHeaders),
		buckets:       slices.Clone(cfg.Buckets),
		bucketByName:  make(map[string]int, len(cfg.Buckets)),
		routeByName:   make(map[string][]int),
		byFirst:       make(map[string][]int),
		tenantHeader:  cfg.TenantHeader,
		accountHeader: cfg.AccountHeader,
		accountField:  cfg.AccountBodyField,
		trustedHops:   cfg.TrustedHops,
		useExternal:   cfg.UseExternalAddressHeader,
		ipv6Prefix:    cfg.IPv6Prefix,
	}
	if e.ipv6Prefix == 0 {
		e.ipv6Prefix = 64
	}
	for i, b := range cfg.Buckets {
		e.addBucket(i, b, cfg, &p)
	}
	shapes := make(map[string]int, len(cfg.Routes))
	for i, r := range cfg.Routes {
		if r.Name != "" {
			e.routeByName[r.Name] = append(e.routeByName[r.Name], i)
		}
		if rt, ok := compileRoute(i, r, cfg, shapes, &p); ok {
			e.routes = append(e.routes, rt)
		}
	}
	if len(p) > 0 {
		return nil, errors.Join(p...)
	}
	e.headerNames, e.wantsBody = e.reads()
	e.indexRoutes()
	return e, nil
}

// problems collects what is wrong with a Config, every problem at once.
type problems []error

func (p *problems) add(format string, args ...any) {
	*p = append(*p, fmt.Errorf("descriptors: "+format, args...))
}

// checkKeys checks the settings every key reads: the hops, the IPv6
// prefix, the tenant, account and cost headers.
func checkKeys(cfg Config, p *problems) {
	if cfg.TrustedHops < 0 {
		p.add("TrustedHops %d is negative", cfg.TrustedHops)
	}
	if cfg.IPv6Prefix < 0 || cfg.IPv6Prefix > 128 {
		p.add("IPv6Prefix %d is not in 0…128", cfg.IPv6Prefix)
	}
	for _, h := range []struct{ field, v string }{
		{"TenantHeader", cfg.TenantHeader},
		{"AccountHeader", cfg.AccountHeader},
	} {
		if problem := HeaderNameProblem(h.v); h.v != "" && problem != "" {
			p.add("%s %q: %s", h.field, h.v, problem)
		}
	}
	for _, h := range cfg.CostHeaders {
		if problem := HeaderNameProblem(h); problem != "" {
			p.add("CostHeaders %q: %s", h, problem)
		}
	}
}

// addBucket checks bucket i, b, and names it in e.
func (e *Engine) addBucket(i int, b Bucket, cfg Config, p *problems) {
	where := bucketDesc(i, b)
	switch {
	case b.Name == "":
		p.add("%s: empty name", where)
	case strings.ContainsAny(b.Name, ", \t\r\n"):
		p.add("%s: name contains a comma or whitespace, so ratelimit_buckets cannot name it", where)
	default:
		if j, dup := e.bucketByName[b.Name]; dup {
			p.add("%s: name already used by bucket %d", where, j)
		} else {
			e.bucketByName[b.Name] = i
		}
	}
	switch b.Key.Kind {
	case KeyTenant:
		if cfg.TenantHeader == "" {
			p.add("%s: keys by tenant but TenantHeader is empty", where)
		}
	case KeyIP:
	case KeyAccount:
		if cfg.AccountHeader == "" && cfg.AccountBodyField == "" {
			p.add("%s: keys by account but neither AccountHeader nor AccountBodyField is set", where)
		}
	case KeyPathParam:
		if !ValidParamName(b.Key.Name) {
			p.add("%s: path param name %q must match [A-Za-z_][A-Za-z0-9_]*", where, b.Key.Name)
		}
	case KeyHeader:
		if problem := HeaderNameProblem(b.Key.Name); problem != "" {
			p.add("%s: header name %q: %s", where, b.Key.Name, problem)
		}
	default:
		p.add("%s: unknown key kind %d", where, uint8(b.Key.Kind))
	}
}

// compileRoute checks and compiles route i, r; ok is false when it has a
// problem. shapes holds the method and template shape of the routes
// before it, by index.
func compileRoute(i int, r Route, cfg Config, shapes map[string]int, p *problems) (rt route, ok bool) {
	where := routeDesc(i, r)
	n := len(*p)
	if !ValidMethod(r.Method) {
		p.add("%s: method %q must be empty (any) or an uppercase HTTP method", where, r.Method)
	}
	tpl, problem := parseTemplate(r.Template)
	if problem != "" {
		p.add("%s: %w: %s", where, ErrInvalidTemplate, problem)
	}
	rt = route{name: r.Name, method: r.Method, tpl: tpl, buckets: slices.Clone(r.Buckets), paramSeg: make([]int, len(r.Buckets))}
	for j, bi := range r.Buckets {
		rt.paramSeg[j] = -1
		switch {
		case bi < 0 || bi >= len(cfg.Buckets):
			p.add("%s: bucket index %d out of range (%d buckets)", where, bi, len(cfg.Buckets))
			continue
		case slices.Index(r.Buckets, bi) < j:
			p.add("%s: lists %s more than once", where, bucketDesc(bi, cfg.Buckets[bi]))
			continue
		}
		switch k := cfg.Buckets[bi].Key; k.Kind {
		case KeyAccount:
			rt.needsAccount = true
		case KeyPathParam:
			rt.paramSeg[j] = tpl.captureSeg(k.Name)
			if problem == "" && rt.paramSeg[j] < 0 {
				p.add("%s: %s keys by path param %q, which the template does not capture", where, bucketDesc(bi, cfg.Buckets[bi]), k.Name)
			}
		}
	}
	if problem == "" {
		key, _ := RouteKey(r.Method, r.Template)
		if j, dup := shapes[key]; dup {
			p.add("%s: duplicate of route %d (same method and template shape)", where, j)
		} else {
			shapes[key] = i
		}
	}
	return rt, len(*p) == n
}

// indexRoutes indexes the routes by their first segment: a path whose
// first segment is "api" is only tried against routes starting with
// "/api/" or with a capture, still in config order.
func (e *Engine) indexRoutes() {
	for i := range e.routes {
		if s := e.routes[i].tpl.segs[0]; s.capture {
			e.anyFirst = append(e.anyFirst, i)
			for lit := range e.byFirst {
				e.byFirst[lit] = append(e.byFirst[lit], i)
			}
		} else {
			if _, seen := e.byFirst[s.lit]; !seen {
				e.byFirst[s.lit] = slices.Clone(e.anyFirst)
			}
			e.byFirst[s.lit] = append(e.byFirst[s.lit], i)
		}
	}
}

// reads lists the headers Describe may read and whether it may read the
// body, from the compiled configuration.
func (e *Engine) reads() ([]string, bool) {
	var names []string
	add := func(n string) {
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if e.useExternal {
		add(headerExternalAddress)
	}
	if e.trustedHops > 0 {
		add(headerForwardedFor)
	}
	body := false
	for _, b := range e.buckets {
		switch b.Key.Kind {
		case KeyTenant:
			add(e.tenantHeader)
		case KeyHeader:
			add(b.Key.Name)
		case KeyAccount:
			add(e.accountHeader)
			if e.accountField != "" {
				body = true
				add(headerPartialBody)
				add(headerContentLength)
				add(headerContentType)
			}
		}
	}
	for _, h := range e.costHeaders {
		add(h)
	}
	return names, body
}

// HeaderNames returns the names of every header Describe may read, and
// Config.CostHeaders (the caller must not modify it): a Request needs
// hold only these.
func (e *Engine) HeaderNames() []string { return e.headerNames }

// WantsBody reports whether Describe may read Request.Body (a bucket keys
// by the account field of a login body): otherwise the body need not be
// decoded at all.
func (e *Engine) WantsBody() bool { return e.wantsBody }

// NumBuckets is the number of buckets the Engine was compiled with: every
// Descriptor.Bucket is below it.
func (e *Engine) NumBuckets() int { return len(e.buckets) }

// NumRoutes is the number of routes the Engine was compiled with: every
// Result.Route is below it.
func (e *Engine) NumRoutes() int { return len(e.routes) }

func bucketDesc(i int, b Bucket) string {
	if b.Name == "" {
		return fmt.Sprintf("bucket %d", i)
	}
	return fmt.Sprintf("bucket %d %q", i, b.Name)
}

func routeDesc(i int, r Route) string {
	m := r.Method
	if m == "" {
		m = "*"
	}
	if r.Name == "" {
		return fmt.Sprintf("route %d (%s %q)", i, m, r.Template)
	}
	return fmt.Sprintf("route %d %q (%s %q)", i, r.Name, m, r.Template)
}

// HeaderNameProblem says what is wrong with a header name as a key source,
// or "" when there is nothing: a name is a lowercase HTTP token (letters,
// digits and !#$%&'*+-.^_`|~; Envoy sends header names lowercase),
// optionally after one ":" (a pseudo-header such as :authority). The
// configuration, the matcher and every other consumer hold names to this
// one rule.
func HeaderNameProblem(h string) string {
	if h == "" || h == ":" {
		return "empty"
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case 'A' <= c && c <= 'Z':
			return "not lowercase (Envoy sends header names lowercase)"
		case c == ':' && i == 0:
		case c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0:
			return fmt.Sprintf("invalid character %q", c)
		}
	}
	return ""
}

// ValidMethod reports whether m is "" (any method) or an uppercase HTTP
// method: the letters A to Z only.
func ValidMethod(m string) bool {
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// ValidBucketName reports whether name is a bucket name: a lowercase
// letter, then up to 62 lowercase letters, digits and "_". Such a name is
// safe unquoted in a header, a metric label and a JSON key.
func ValidBucketName(name string) bool {
	if name == "" || len(name) > 63 || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Describe returns the descriptors that apply to r, appended to dst.
//
// Route selection, in order: ratelimit_route naming a route (that route
// applies, whatever the method; of several routes sharing the name, the
// first whose template matches the path, else the first); else the first
// route in config order whose method and template match the normalised
// path. ratelimit_buckets, when present, replaces the route's buckets by the
// named ones (an empty value names none: the request is exempt); their path
// params come from the named route, else from the first route whose
// template matches the path (any method). A path param whose template did
// not match the path is missing.
//
// Describe does not allocate when dst has room, the path needs no
// normalisation, the client IP is written canonically, and the account (if
// needed) needs no lower-casing or unescaping.
func (e *Engine) Describe(r *checkreq.Request, dst []Descriptor) Result {
	res := Result{Route: -1, Descriptors: dst}
	if r == nil {
		return res
	}
	ip := e.clientIP(r)
	res.ClientIP = ip

	path, tooLong, pathOK := routePath(r.Path)
	res.PathTooLong = tooLong
	list, hasList := r.ContextExtensions.Get(checkreq.ExtBuckets)

	ri, matched := -1, false
	if name := r.ContextExtensions.Value(checkreq.ExtRoute); name != "" {
		if group := e.routeByName[name]; len(group) > 0 {
			ri = group[0]
			for _, i := range group {
				if pathOK && e.routes[i].tpl.match(path) {
					ri, matched = i, true
					break
				}
			}
		} else {
			res.UnknownRoute = true
		}
	}
	if ri < 0 && pathOK {
		// ratelimit_buckets only borrows a route's path params: any method.
		ri = e.find(path, r.Method, hasList)
		matched = ri >= 0
	}
	res.Route = ri

	k := keyer{e: e, headers: r.Headers, body: r.Body, path: path, clientIP: ip}
	if matched {
		k.rt = &e.routes[ri]
	}
	if hasList {
		start := len(res.Descriptors)
		for rest := list; rest != ""; {
			var name string
			name, rest, _ = strings.Cut(rest, ",")
			name = strings.TrimSpace(name)
			if name == "" {
				continue
			}
			bi, ok := e.bucketByName[name]
			if !ok {
				res.UnknownBuckets++
				continue
			}
			if slices.ContainsFunc(res.Descriptors[start:], func(d Descriptor) bool { return d.Bucket == bi }) {
				continue
			}
			seg := -1
			if k.rt != nil && e.buckets[bi].Key.Kind == KeyPathParam {
				seg = k.rt.tpl.captureSeg(e.buckets[bi].Key.Name)
			}
			res.Descriptors = k.appendDescriptors(res.Descriptors, bi, seg)
		}
		k.report(&res)
		return res
	}
	if ri < 0 {
		return res
	}
	rt := &e.routes[ri]
	for j, bi := range rt.buckets {
		seg := -1
		if matched {
			seg = rt.paramSeg[j]
		}
		res.Descriptors = k.appendDescriptors(res.Descriptors, bi, seg)
	}
	k.report(&res)
	return res
}

// find returns the first route matching the normalised path p and method
// (any method when anyMethod), or -1.
func (e *Engine) find(p, method string, anyMethod bool) int {
	cands, ok := e.byFirst[firstSegment(p)]
	if !ok {
		cands = e.anyFirst
	}
	for _, i := range cands {
		rt := &e.routes[i]
		if !anyMethod && rt.method != "" && rt.method != method {
			continue
		}
		if rt.tpl.match(p) {
			return i
		}
	}
	return -1
}

// keyer computes the keys of one request, the accounts and the IP key at
// most once. It holds no pointer to the Request or the Result: escape
// analysis does not tell fields apart, so the keys it returns would drag
// those (and the caller's dst) to the heap.
type keyer struct {
	e        *Engine
	headers  checkreq.Fields
	body     string
	path     string
	rt       *route // the route whose template matched the path, if any
	clientIP string
	ipKey    string
	ipDone   bool
	accounts accountSet
	acctDone bool
}

// appendDescriptors appends the descriptors of bucket bi: one, except for a
// bucket keyed by account, which has one per account the request presents
// (and one keyed UnreadableAccount when some cannot be read). seg is the
// path segment of a path param key (-1: missing).
func (k *keyer) appendDescriptors(dst []Descriptor, bi int, seg int) []Descriptor {
	if k.e.buckets[bi].Key.Kind != KeyAccount {
		return append(dst, Descriptor{Bucket: bi, Key: k.key(bi, seg)})
	}
	if !k.acctDone {
		k.acctDone = true
		k.e.accounts(k.headers, k.body, &k.accounts)
	}
	for _, a := range k.accounts.v[:k.accounts.n] {
		dst = append(dst, Descriptor{Bucket: bi, Key: a})
	}
	if k.accounts.unreadable {
		dst = append(dst, Descriptor{Bucket: bi, Key: UnreadableAccount})
	}
	return dst
}

// report copies what the keyer found about the accounts into res.
func (k *keyer) report(res *Result) {
	if k.accounts.n > 0 {
		res.Account = k.accounts.v[0]
	}
	res.AccountUnreadable = k.accounts.unreadable
}

// key returns the key of bucket bi, which is not keyed by account; seg is
// the path segment of a path param key (-1: missing).
func (k *keyer) key(bi int, seg int) string {
	switch spec := k.e.buckets[bi].Key; spec.Kind {
	case KeyTenant:
		return k.headers.Value(k.e.tenantHeader)
	case KeyIP:
		if !k.ipDone {
			k.ipDone = true
			k.ipKey = ipKey(k.clientIP, k.e.ipv6Prefix)
		}
		return k.ipKey
	case KeyPathParam:
		if seg < 0 {
			return ""
		}
		return segment(k.path, seg)
	case KeyHeader:
		return k.headers.Value(spec.Name)
	}
	return ""
}
