package kubernetes_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-authz/ratelimit-authz/deploy/internal/serverbin"
)

// serverBin is the server, built once for this test binary.
var serverBin string

func TestMain(m *testing.M) { serverbin.Main(m, &serverBin) }

// The kustomizations users apply.
var kustomizations = []string{"overlays/single", "overlays/cluster", "envoy"}

// object is one decoded manifest.
type object struct {
	kind, name string
	obj        any
}

// newObject returns an empty API object of apiVersion/kind, or nil for a
// kind the manifests are not expected to hold.
func newObject(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/Secret":
		return &corev1.Secret{}
	case "v1/Service":
		return &corev1.Service{}
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}
	case "batch/v1/Job":
		return &batchv1.Job{}
	case "batch/v1/CronJob":
		return &batchv1.CronJob{}
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	}
	return nil
}

// decodeStrict decodes one YAML document into its API type; unknown or
// duplicate fields fail.
func decodeStrict(doc []byte) (object, error) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return object{}, err
	}
	obj := newObject(meta.APIVersion, meta.Kind)
	if obj == nil {
		return object{}, fmt.Errorf("%s %s: not a kind these manifests use", meta.APIVersion, meta.Kind)
	}
	// As the API server decodes: YAML to JSON refusing duplicate keys, then
	// case-sensitive field names with unknown fields refused.
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return object{}, fmt.Errorf("%s %s: %w", meta.Kind, meta.Metadata.Name, err)
	}
	strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err == nil && len(strict) > 0 {
		err = errors.Join(strict...)
	}
	if err != nil {
		return object{}, fmt.Errorf("%s %s: %w", meta.Kind, meta.Metadata.Name, err)
	}
	return object{kind: meta.Kind, name: meta.Metadata.Name, obj: obj}, nil
}

func splitDocs(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(b, []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

// render builds a kustomization with kustomize's own library, as
// `kubectl apply -k` does (default options: files only from inside the
// kustomization root), and decodes every object strictly.
func render(t *testing.T, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	var objs []object
	for _, doc := range splitDocs(out) {
		o, err := decodeStrict(doc)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		objs = append(objs, o)
	}
	return objs
}

// TestSourcesDecodeStrictly: every manifest file, including patches and the
// example Secrets that no kustomization applies, decodes strictly; a
// misspelt field anywhere fails here.
func TestSourcesDecodeStrictly(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		if base := filepath.Base(p); base == "kustomization.yaml" || base == "envoy.yaml" || base == "ratelimit.yaml" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, doc := range splitDocs(b) {
			if _, err := decodeStrict(doc); err != nil {
				t.Errorf("%s: %v", p, err)
			}
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 15 {
		t.Errorf("decoded %d documents: fewer than the manifests hold", n)
	}
	// The decoder itself refuses a misspelt, an unknown and a repeated field.
	for _, bad := range []string{
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIp: None}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIP: None, replicas: 2}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIP: None, clusterIP: 10.0.0.1}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
	} {
		if _, err := decodeStrict([]byte(bad)); err == nil {
			t.Errorf("decoded without error: %q", bad)
		}
	}
}

// TestCopiesMatch: the files kustomize needs inside its root are exact
// copies of the shipped ones.
func TestCopiesMatch(t *testing.T) {
	root, err := serverbin.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	for copyPath, orig := range map[string]string{
		"base/ratelimit.yaml":       "config/ratelimit.yaml",
		"nats/ratelimit-authz.conf": "deploy/nats/nats-server.conf",
	} {
		a, err := os.ReadFile(copyPath)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, orig))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("deploy/kubernetes/%s differs from %s: cp %s deploy/kubernetes/%s", copyPath, orig, orig, copyPath)
		}
	}
}

// Go runtime variables a manifest may set although the binary's help
// does not name them.
var goRuntimeEnv = map[string]bool{"GOMAXPROCS": true, "GOMEMLIMIT": true, "GOGC": true, "GODEBUG": true}

type checker struct {
	t        *testing.T
	where    string
	surfaces map[string]*serverbin.Surface // by subcommand
	objs     []object
}

func (c *checker) errorf(format string, args ...any) {
	c.t.Helper()
	c.t.Errorf(c.where+": "+format, args...)
}

func (c *checker) configMap(name string) *corev1.ConfigMap {
	for _, o := range c.objs {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok && cm.Name == name {
			return cm
		}
	}
	return nil
}

// exampleSecretKeys are the keys of the example Secrets (which no overlay
// applies), by Secret name.
func exampleSecretKeys(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	files, _ := filepath.Glob("components/*/secret.example.yaml")
	if len(files) == 0 {
		t.Fatal("no example Secrets")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range splitDocs(b) {
			o, err := decodeStrict(doc)
			if err != nil {
				t.Fatal(err)
			}
			s := o.obj.(*corev1.Secret)
			for k := range s.StringData {
				out[s.Name] = append(out[s.Name], k)
			}
		}
	}
	return out
}

// fileOf says which volume (and key in it) serves path in the container,
// or an error.
func (c *checker) checkFile(path string, ctr corev1.Container, pod corev1.PodSpec, secrets map[string][]string) {
	c.t.Helper()
	var mount *corev1.VolumeMount
	for i, m := range ctr.VolumeMounts {
		if strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			mount = &ctr.VolumeMounts[i]
		}
	}
	if mount == nil {
		c.errorf("container %s: %s is on no volume mount", ctr.Name, path)
		return
	}
	rel := strings.TrimPrefix(path, strings.TrimSuffix(mount.MountPath, "/")+"/")
	var vol *corev1.Volume
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == mount.Name {
			vol = &pod.Volumes[i]
		}
	}
	switch {
	case vol == nil:
		c.errorf("container %s: mount %s names no volume", ctr.Name, mount.Name)
	case vol.ConfigMap != nil:
		cm := c.configMap(vol.ConfigMap.Name)
		if cm == nil {
			c.errorf("volume %s: no ConfigMap %s", vol.Name, vol.ConfigMap.Name)
		} else if _, ok := cm.Data[rel]; !ok {
			c.errorf("%s: ConfigMap %s has no key %s", path, cm.Name, rel)
		}
	case vol.Secret != nil:
		keys, ok := secrets[vol.Secret.SecretName]
		if !ok {
			c.errorf("volume %s: Secret %s has no example (components/*/secret.example.yaml)", vol.Name, vol.Secret.SecretName)
		}
		found := false
		for _, it := range vol.Secret.Items {
			if it.Path == rel {
				found = true
				if !slices.Contains(keys, it.Key) {
					c.errorf("%s: key %s is not in the example Secret %s", path, it.Key, vol.Secret.SecretName)
				}
			}
		}
		if !found {
			c.errorf("%s: no item of Secret volume %s", path, vol.Name)
		}
	case vol.EmptyDir != nil:
		if mount.ReadOnly {
			c.errorf("%s: read-only emptyDir", path)
		}
	default:
		c.errorf("%s: volume %s of an unexpected kind", path, vol.Name)
	}
}

func port(addr string) (int32, bool) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return 0, false
	}
	p, err := strconv.Atoi(addr[i+1:])
	return int32(p), err == nil && p > 0
}

// checkServer checks a container that runs the ratelimit-authz image.
// It returns the container's settings (env value, else the flag's
// default) for the pod-level checks.
func (c *checker) checkServer(ctr corev1.Container, pod corev1.PodSpec, secrets map[string][]string) map[string]string {
	c.t.Helper()
	sub := "serve" // the image's entrypoint
	args := ctr.Args
	if len(ctr.Command) > 0 {
		if ctr.Command[0] != "/ratelimit-authz" || len(ctr.Command) < 2 {
			c.errorf("container %s: command %q: want /ratelimit-authz SUBCOMMAND", ctr.Name, ctr.Command)
			return nil
		}
		sub = ctr.Command[1]
		args = append(slices.Clone(ctr.Command[2:]), args...)
	}
	s := c.surfaces[sub]
	if s == nil {
		c.errorf("container %s: subcommand %q is not one the tests know (%v)", ctr.Name, sub, slices.Collect(mapsKeys(c.surfaces)))
		return nil
	}
	settings := map[string]string{}
	for _, f := range s.Flags {
		settings[f.Name] = f.Default
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			c.errorf("container %s: argument %q is not a flag", ctr.Name, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if _, ok := s.Flags[name]; !ok {
			c.errorf("container %s: ratelimit-authz %s has no flag --%s", ctr.Name, sub, name)
			continue
		}
		if !hasVal && i+1 < len(args) {
			i++
			val = args[i]
		}
		settings[name] = val
	}
	for _, e := range ctr.Env {
		if goRuntimeEnv[e.Name] {
			continue
		}
		if !s.Env[e.Name] {
			c.errorf("container %s: ratelimit-authz %s reads no variable %s (it reads %v)", ctr.Name, sub, e.Name, s.SortedEnv())
			continue
		}
		if e.ValueFrom != nil && (e.ValueFrom.SecretKeyRef != nil) {
			c.errorf("container %s: %s from a Secret as plain env: mount it as a file (the *_FILE variables)", ctr.Name, e.Name)
		}
		if f, ok := s.EnvFlag(e.Name); ok && e.ValueFrom == nil {
			settings[f.Name] = e.Value
			if strings.HasPrefix(e.Value, "/") {
				c.checkFile(e.Value, ctr, pod, secrets)
			}
		}
	}
	// Every listen address's port is a container port, and every container
	// port is one the server listens on.
	listen := map[int32]string{}
	for _, f := range s.Flags {
		if strings.HasSuffix(f.Name, "-addr") && settings[f.Name] != "" {
			if p, ok := port(settings[f.Name]); ok {
				listen[p] = f.Name
			}
		}
	}
	for _, cp := range ctr.Ports {
		if _, ok := listen[cp.ContainerPort]; !ok {
			c.errorf("container %s: port %s %d: the server listens on %v", ctr.Name, cp.Name, cp.ContainerPort, listen)
		}
	}
	if sub == "serve" {
		for _, f := range []string{"grpc-addr", "check-addr", "http-addr"} {
			if settings[f] == "" {
				c.errorf("container %s: --%s is not set", ctr.Name, f)
				continue
			}
			p, _ := port(settings[f])
			if !slices.ContainsFunc(ctr.Ports, func(cp corev1.ContainerPort) bool { return cp.ContainerPort == p }) {
				c.errorf("container %s: --%s %s has no container port", ctr.Name, f, settings[f])
			}
			if a := settings[f]; strings.HasPrefix(a, "127.") || strings.HasPrefix(a, "localhost") {
				c.errorf("container %s: --%s %s is loopback: unreachable from other pods and the kubelet", ctr.Name, f, a)
			}
		}
		httpPort, _ := port(settings["http-addr"])
		for what, pr := range map[string]*corev1.Probe{"readiness": ctr.ReadinessProbe, "liveness": ctr.LivenessProbe} {
			if pr == nil || pr.HTTPGet == nil {
				c.errorf("container %s: no HTTP %s probe", ctr.Name, what)
				continue
			}
			if !s.Paths[pr.HTTPGet.Path] {
				c.errorf("container %s: %s probe path %s: the server serves %v", ctr.Name, what, pr.HTTPGet.Path, s.Paths)
			}
			if containerPort(ctr, pr.HTTPGet.Port) != httpPort {
				c.errorf("container %s: %s probe port %s is not --http-addr %s", ctr.Name, what, pr.HTTPGet.Port.String(), settings["http-addr"])
			}
		}
		if ctr.ReadinessProbe != nil && ctr.ReadinessProbe.HTTPGet != nil && ctr.ReadinessProbe.HTTPGet.Path != "/readyz" {
			c.errorf("readiness must probe /readyz (warm start, drain)")
		}
		if ctr.LivenessProbe != nil && ctr.LivenessProbe.HTTPGet != nil && ctr.LivenessProbe.HTTPGet.Path != "/healthz" {
			c.errorf("liveness must probe /healthz (a liveness on /readyz restarts draining pods)")
		}
		if ctr.Resources.Requests.Cpu().IsZero() || ctr.Resources.Requests.Memory().IsZero() || ctr.Resources.Limits.Memory().IsZero() {
			c.errorf("container %s: CPU and memory requests and a memory limit are required", ctr.Name)
		}
	}
	return settings
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func containerPort(ctr corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range ctr.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return -1
}

func (c *checker) checkSecurity(what string, pod corev1.PodSpec) {
	c.t.Helper()
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		pod.SecurityContext.RunAsUser == nil || *pod.SecurityContext.RunAsUser == 0 {
		c.errorf("%s: the pod must run as a numeric non-root user", what)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		c.errorf("%s: automountServiceAccountToken must be false", what)
	}
	for _, ctr := range pod.Containers {
		sc := ctr.SecurityContext
		switch {
		case sc == nil:
			c.errorf("%s/%s: no securityContext", what, ctr.Name)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			c.errorf("%s/%s: allowPrivilegeEscalation must be false", what, ctr.Name)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			c.errorf("%s/%s: readOnlyRootFilesystem must be true", what, ctr.Name)
		case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
			c.errorf("%s/%s: capabilities must drop ALL and add none", what, ctr.Name)
		case sc.Privileged != nil && *sc.Privileged:
			c.errorf("%s/%s: privileged", what, ctr.Name)
		}
		if ctr.Resources.Requests.Memory().IsZero() || ctr.Resources.Limits.Memory().IsZero() {
			c.errorf("%s/%s: no memory request or limit", what, ctr.Name)
		}
	}
}

func isServerImage(image string) bool {
	name, _, _ := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
	return name == "ratelimit-authz"
}

func duration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("duration %q: %v", s, err)
	}
	return d
}

// TestManifestsMatchBinary renders every kustomization and checks each
// object against the binary's help (flags, variables, paths) and against
// the other objects (Services, policies and budgets select the pods, ports
// exist, files come from volumes that have them).
func TestManifestsMatchBinary(t *testing.T) {
	surfaces := map[string]*serverbin.Surface{}
	for _, sub := range []string{"serve", "migrate"} {
		s, err := serverbin.Help(context.Background(), serverBin, sub)
		if err != nil {
			t.Fatal(err)
		}
		surfaces[sub] = s
	}
	secrets := exampleSecretKeys(t)
	for _, dir := range kustomizations {
		t.Run(strings.ReplaceAll(dir, "/", "_"), func(t *testing.T) {
			objs := render(t, dir)
			c := &checker{t: t, where: dir, surfaces: surfaces, objs: objs}
			type podOwner struct {
				name   string
				labels map[string]string
				spec   corev1.PodSpec
			}
			var pods []podOwner
			servers := 0
			for _, o := range objs {
				switch v := o.obj.(type) {
				case *appsv1.Deployment:
					pods = append(pods, podOwner{v.Name, v.Spec.Template.Labels, v.Spec.Template.Spec})
					sel, err := metaSelector(v.Spec.Selector.MatchLabels)
					if err != nil || !sel.Matches(labels.Set(v.Spec.Template.Labels)) {
						c.errorf("Deployment %s: selector does not match its pods", v.Name)
					}
				case *appsv1.StatefulSet:
					pods = append(pods, podOwner{v.Name, v.Spec.Template.Labels, v.Spec.Template.Spec})
				case *batchv1.Job:
					pods = append(pods, podOwner{v.Name, v.Spec.Template.Labels, v.Spec.Template.Spec})
				case *batchv1.CronJob:
					pods = append(pods, podOwner{v.Name, v.Spec.JobTemplate.Spec.Template.Labels, v.Spec.JobTemplate.Spec.Template.Spec})
				}
			}
			for _, p := range pods {
				c.checkSecurity(p.name, p.spec)
				for _, ctr := range p.spec.Containers {
					if !isServerImage(ctr.Image) {
						continue
					}
					settings := c.checkServer(ctr, p.spec, secrets)
					if len(ctr.Command) == 0 && settings != nil { // the server
						servers++
						drain := duration(t, settings["drain-delay"])
						stop := duration(t, settings["shutdown-timeout"])
						grace := 30 * time.Second // Kubernetes' default
						if g := p.spec.TerminationGracePeriodSeconds; g != nil {
							grace = time.Duration(*g) * time.Second
						}
						if grace <= drain+stop {
							c.errorf("%s: terminationGracePeriodSeconds %v is not above drain %v + shutdown %v", p.name, grace, drain, stop)
						}
						if drain < envoyDNSRefresh(t) {
							c.errorf("%s: drain delay %v is shorter than Envoy's DNS refresh %v in envoy/envoy.yaml", p.name, drain, envoyDNSRefresh(t))
						}
					}
				}
			}
			if dir != "envoy" && servers != 1 {
				c.errorf("%d ratelimit-authz servers: want one Deployment", servers)
			}
			// Every selector selects pods, every named port exists on them.
			podsOf := func(sel map[string]string) []podOwner {
				var out []podOwner
				for _, p := range pods {
					if len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(p.labels)) {
						out = append(out, p)
					}
				}
				return out
			}
			hasPort := func(ps []podOwner, p intstr.IntOrString) bool {
				for _, po := range ps {
					for _, ctr := range po.spec.Containers {
						if containerPort(ctr, p) > 0 && (p.Type == intstr.String || slices.ContainsFunc(ctr.Ports, func(cp corev1.ContainerPort) bool { return cp.ContainerPort == p.IntVal })) {
							return true
						}
					}
				}
				return false
			}
			for _, o := range objs {
				switch v := o.obj.(type) {
				case *corev1.Service:
					ps := podsOf(v.Spec.Selector)
					if len(ps) == 0 {
						c.errorf("Service %s selects no pods", v.Name)
					}
					for _, sp := range v.Spec.Ports {
						if !hasPort(ps, sp.TargetPort) {
							c.errorf("Service %s port %s: target %s is no container port", v.Name, sp.Name, sp.TargetPort.String())
						}
						if sp.AppProtocol == nil {
							c.errorf("Service %s port %s: no appProtocol", v.Name, sp.Name)
						}
						if (sp.Name == "grpc" || sp.Name == "check") && (sp.AppProtocol == nil || *sp.AppProtocol != "kubernetes.io/h2c") {
							c.errorf("Service %s: the %s port (HTTP/2 without TLS) must say appProtocol kubernetes.io/h2c", v.Name, sp.Name)
						}
					}
				case *networkingv1.NetworkPolicy:
					ps := podsOf(v.Spec.PodSelector.MatchLabels)
					if len(ps) == 0 {
						c.errorf("NetworkPolicy %s selects no pods", v.Name)
					}
					for _, in := range v.Spec.Ingress {
						if len(in.From) == 0 {
							c.errorf("NetworkPolicy %s: an ingress rule open to everyone", v.Name)
						}
						for _, p := range in.Ports {
							if p.Port == nil || !hasPort(ps, *p.Port) {
								c.errorf("NetworkPolicy %s: port %v is no container port", v.Name, p.Port)
							}
						}
					}
				case *policyv1.PodDisruptionBudget:
					if len(podsOf(v.Spec.Selector.MatchLabels)) == 0 {
						c.errorf("PodDisruptionBudget %s selects no pods", v.Name)
					}
					if v.Spec.MinAvailable != nil {
						c.errorf("PodDisruptionBudget %s: minAvailable blocks drains of a single replica; use maxUnavailable", v.Name)
					}
				}
			}
		})
	}
}

func metaSelector(m map[string]string) (labels.Selector, error) {
	if len(m) == 0 {
		return nil, fmt.Errorf("empty selector")
	}
	return labels.SelectorFromSet(m), nil
}

// TestNetworkPolicyAdmitsOnlyEnvoy: the gRPC port (Check and the access-log
// stream) and the lean Check listener admit only pods labelled as Envoy,
// which the example Envoy is.
func TestNetworkPolicyAdmitsOnlyEnvoy(t *testing.T) {
	var policy *networkingv1.NetworkPolicy
	var server *appsv1.Deployment
	for _, o := range render(t, "overlays/cluster") {
		switch v := o.obj.(type) {
		case *networkingv1.NetworkPolicy:
			if v.Name == "ratelimit-authz" {
				policy = v
			}
		case *appsv1.Deployment:
			server = v
		}
	}
	var envoy *appsv1.Deployment
	for _, o := range render(t, "envoy") {
		if d, ok := o.obj.(*appsv1.Deployment); ok {
			envoy = d
		}
	}
	if policy == nil || server == nil || envoy == nil {
		t.Fatal("missing the policy, the server or Envoy")
	}
	// admitted follows NetworkPolicy's semantics: a rule without ports
	// (or with a port entry that names none) admits every port, one
	// without peers every source; an ipBlock, or a namespace selector
	// without a pod selector, admits pods whatever their labels.
	admitted := func(podLabels map[string]string, target int32) bool {
		for _, in := range policy.Spec.Ingress {
			portOK := len(in.Ports) == 0
			for _, p := range in.Ports {
				portOK = portOK || p.Port == nil || containerPort(server.Spec.Template.Spec.Containers[0], *p.Port) == target
			}
			if !portOK {
				continue
			}
			if len(in.From) == 0 {
				return true
			}
			for _, from := range in.From {
				if from.IPBlock != nil || from.PodSelector == nil {
					return true
				}
				sel, err := metav1.LabelSelectorAsSelector(from.PodSelector)
				if err != nil {
					t.Fatalf("the policy's pod selector: %v", err)
				}
				if sel.Matches(labels.Set(podLabels)) {
					return true
				}
			}
		}
		return false
	}
	for _, name := range []string{"grpc", "check"} {
		target := containerPort(server.Spec.Template.Spec.Containers[0], intstr.FromString(name))
		if target < 0 {
			t.Fatalf("the server has no container port %s", name)
		}
		if !admitted(envoy.Spec.Template.Labels, target) {
			t.Errorf("the example Envoy is not admitted to port %s", name)
		}
		if admitted(map[string]string{"app.kubernetes.io/name": "app"}, target) || admitted(map[string]string{}, target) {
			t.Errorf("a pod without the Envoy label is admitted to port %s", name)
		}
	}
}

// envoyDNSRefresh is the longest dns_refresh_rate of the ratelimit-authz
// clusters (the lean Check listener's and the gRPC port's) in the shipped
// Kubernetes bootstrap.
func envoyDNSRefresh(t *testing.T) time.Duration {
	t.Helper()
	var boot struct {
		StaticResources struct {
			Clusters []struct {
				Name           string `json:"name"`
				DNSRefreshRate string `json:"dns_refresh_rate"`
			} `json:"clusters"`
		} `json:"static_resources"`
	}
	b, err := os.ReadFile("envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &boot); err != nil {
		t.Fatal(err)
	}
	var longest time.Duration
	found := 0
	for _, c := range boot.StaticResources.Clusters {
		if c.Name == "ratelimit_authz" || c.Name == "ratelimit_authz_check" {
			found++
			longest = max(longest, duration(t, c.DNSRefreshRate))
		}
	}
	if found != 2 {
		t.Fatalf("envoy/envoy.yaml: %d of the clusters ratelimit_authz and ratelimit_authz_check", found)
	}
	return longest
}
