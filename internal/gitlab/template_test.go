package gitlab

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"k8s.io/apimachinery/pkg/api/resource"
)

// kind is a TOML value's type as BurntSushi/toml (the library GitLab Runner decodes its
// config.toml with) decodes it into an untyped document.
type kind int

const (
	kString        kind = iota
	kInt                // TOML integer
	kBool               //
	kStringOrArray      // a string or an array of strings (the runner's StringOrArray)
	kStringArray        //
	kStringTable        // a table of string values (map[string]string)
	kIntTable           // a table of integer values (map[string]int)
	kBoolTable          // a table of boolean values (map[string]bool)
	kTable              // a struct: its keys in sub
	kTableArray         // an array of structs ([[...]]): their keys in sub
)

func (k kind) String() string {
	return [...]string{"a string", "an integer", "a boolean", "a string or an array of strings", "an array of strings",
		"a table of strings", "a table of integers", "a table of booleans", "a table", "an array of tables"}[k]
}

// unit is what a value means beyond its TOML type, as GitLab Runner documents it.
type unit int

const (
	noUnit       unit = iota
	seconds           // an integer count of seconds
	kib               // an integer count of kilobytes (1024 bytes: 4096 is the 4 MiB log cap)
	millis            // an integer count of milliseconds
	cpu               // a Kubernetes CPU quantity string: 2, 500m
	bytes             // a Kubernetes memory quantity string: 512Mi, 2Gi
	duration          // a Go duration string: 5m
	pullPolicies      // never, if-not-present, always
	selectorOp        // In, NotIn, Exists, DoesNotExist
)

// setting is one documented key.
type setting struct {
	kind kind
	unit unit
	sub  map[string]setting // kTable, kTableArray: its keys; nil: not described here
}

func of(k kind) setting                     { return setting{kind: k} }
func in(k kind, u unit) setting             { return setting{kind: k, unit: u} }
func table(sub map[string]setting) setting  { return setting{kind: kTable, sub: sub} }
func tables(sub map[string]setting) setting { return setting{kind: kTableArray, sub: sub} }

// The reference: GitLab Runner's documented settings, names and types as its
// common/config.go declares them (toml tags of RunnerConfig, RunnerSettings and
// KubernetesConfig; gitlabhq/gitlab-runner at d79f3e7b, August 2026) and units as
// docs/executors/kubernetes/_index.md describes them. Only facts are taken: key, type,
// unit. A key the runner does not know is ignored by it without a word, so a misspelling
// is caught here or nowhere. runnerReference returns the [[runners]] table's keys.
func runnerReference() map[string]setting {
	labelSelectorRequirement := map[string]setting{
		"key": of(kString), "operator": in(kString, selectorOp), "values": of(kStringArray),
	}
	labelSelector := map[string]setting{
		"match_labels": of(kStringTable), "match_expressions": tables(labelSelectorRequirement),
	}
	podAffinityTerm := map[string]setting{
		"label_selector": table(labelSelector), "namespaces": of(kStringArray), "topology_key": of(kString),
		"namespace_selector": table(labelSelector), "match_label_keys": of(kStringArray), "mismatch_label_keys": of(kStringArray),
	}
	affinity := map[string]setting{
		"node_affinity": of(kTable),
		"pod_affinity":  of(kTable),
		"pod_anti_affinity": table(map[string]setting{
			"required_during_scheduling_ignored_during_execution":  tables(podAffinityTerm),
			"preferred_during_scheduling_ignored_during_execution": of(kTableArray),
		}),
	}
	kubernetesSettings := func() map[string]setting {
		m := map[string]setting{
			"host": of(kString), "context": of(kString), "cert_file": of(kString), "key_file": of(kString), "ca_file": of(kString),
			"bearer_token_overwrite_allowed": of(kBool), "bearer_token": of(kString),
			"image": of(kString), "namespace": of(kString), "namespace_overwrite_allowed": of(kString), "namespace_per_job": of(kBool),
			"privileged": of(kBool), "runtime_class_name": of(kString), "allow_privilege_escalation": of(kBool),
			"allowed_images": of(kStringArray), "allowed_pull_policies": of(kStringArray), "allowed_services": of(kStringArray),
			"allowed_users": of(kStringArray), "allowed_groups": of(kStringArray),
			"pull_policy":   in(kStringOrArray, pullPolicies),
			"node_selector": of(kStringTable), "node_selector_overwrite_allowed": of(kString),
			"node_tolerations": of(kStringTable), "node_tolerations_overwrite_allowed": of(kString),
			"affinity":           table(affinity),
			"image_pull_secrets": of(kStringArray), "use_service_account_image_pull_secrets": of(kBool),
			"helper_image": of(kString), "helper_image_flavor": of(kString), "helper_image_autoset_arch_and_os": of(kBool),
			"pod_termination_grace_period_seconds": in(kInt, seconds), "cleanup_grace_period_seconds": in(kInt, seconds),
			"cleanup_resources_timeout": in(kString, duration),
			"poll_interval":             in(kInt, seconds), "poll_timeout": in(kInt, seconds),
			"resource_availability_check_max_attempts": of(kInt),
			"retry_limit": of(kInt), "retry_backoff_max": in(kInt, millis), "retry_limits": of(kIntTable),
			"pod_labels": of(kStringTable), "pod_labels_overwrite_allowed": of(kString),
			"scheduler_name": of(kString), "service_account": of(kString), "service_account_overwrite_allowed": of(kString),
			"automount_service_account_token": of(kBool),
			"pod_annotations":                 of(kStringTable), "pod_annotations_overwrite_allowed": of(kString),
			"pod_security_context": of(kTable), "init_permissions_container_security_context": of(kTable),
			"build_container_security_context": of(kTable), "helper_container_security_context": of(kTable),
			"service_container_security_context": of(kTable),
			"volumes":                            of(kTable), "host_aliases": of(kTableArray), "services": of(kTableArray),
			"cap_add": of(kStringArray), "cap_drop": of(kStringArray),
			"suspend_pvc_size": in(kString, bytes), "suspend_pvc_storage_class": of(kString),
			"dns_policy": of(kString), "dns_config": of(kTable), "container_lifecycle": of(kTable),
			"priority_class_name": of(kString), "pod_spec": of(kTableArray),
			"logs_base_dir": of(kString), "scripts_base_dir": of(kString),
			"print_pod_warning_events": of(kBool), "pod_disruption_budget": of(kBool),
			"autoscaler": of(kTable),
		}
		// Requests, limits and their overwrite maxima: build (no prefix), helper, service, pod.
		for _, who := range []string{"", "helper_", "service_", "pod_"} {
			for _, res := range []struct {
				name string
				unit unit
			}{{"cpu", cpu}, {"memory", bytes}, {"ephemeral_storage", bytes}} {
				if who == "pod_" && res.name == "ephemeral_storage" {
					continue // there is no pod-level ephemeral storage setting
				}
				for _, what := range []string{"_limit", "_request"} {
					m[who+res.name+what] = in(kString, res.unit)
					m[who+res.name+what+"_overwrite_max_allowed"] = in(kString, res.unit)
				}
			}
		}
		return m
	}()
	// The [[runners]] keys a template may carry; url and token are documented too, but
	// `register` adds them and a template must not.
	return map[string]setting{
		"name": of(kString), "limit": of(kInt), "output_limit": in(kInt, kib), "request_concurrency": of(kInt),
		"executor": of(kString), "builds_dir": of(kString), "cache_dir": of(kString), "clone_url": of(kString),
		"environment": of(kStringArray), "shell": of(kString),
		"pre_get_sources_script": of(kString), "post_get_sources_script": of(kString),
		"pre_build_script": of(kString), "post_build_script": of(kString),
		"feature_flags": of(kBoolTable),
		"kubernetes":    table(kubernetesSettings),
		// CacheConfig and CacheS3Config: CamelCase keys, as the runner declares them.
		"cache": table(map[string]setting{
			"Type": of(kString), "Path": of(kString), "Shared": of(kBool), "MaxUploadedArchiveSize": of(kInt),
			"s3": table(map[string]setting{
				"ServerAddress": of(kString), "AccessKey": of(kString), "SecretKey": of(kString), "SessionToken": of(kString),
				"BucketName": of(kString), "BucketLocation": of(kString), "Insecure": of(kBool),
				"AuthenticationType": of(kString), "ServerSideEncryption": of(kString), "ServerSideEncryptionKeyID": of(kString),
				"DualStack": of(kBool), "PathStyle": of(kBool), "Accelerate": of(kBool), "RoleARN": of(kString),
			}),
			"gcs": of(kTable), "azure": of(kTable),
		}),
	}
}

// checkRunnerConfig decodes a config.toml template and says what GitLab Runner would
// not take as meant: an unknown key, a value of the wrong type, a value in the wrong
// unit, or not exactly one [[runners]] entry (`register --template-config` wants one).
func checkRunnerConfig(text string) []string {
	var doc map[string]any
	if _, err := toml.Decode(text, &doc); err != nil {
		return []string{"does not parse: " + err.Error()}
	}
	var problems []string
	for k := range doc {
		if k != "runners" {
			problems = append(problems, fmt.Sprintf("unknown top-level key %q", k))
		}
	}
	runners, ok := doc["runners"].([]map[string]any)
	if !ok || len(runners) != 1 {
		return append(problems, fmt.Sprintf("want exactly one [[runners]] table, got %T %v", doc["runners"], doc["runners"]))
	}
	return append(problems, checkTable("runners", runners[0], runnerReference())...)
}

func checkTable(path string, t map[string]any, schema map[string]setting) []string {
	var problems []string
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := path + "." + k
		st, ok := schema[k]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: not a GitLab Runner setting (the runner would ignore it silently)", p))
			continue
		}
		problems = append(problems, checkValue(p, t[k], st)...)
	}
	return problems
}

func checkValue(path string, v any, st setting) []string {
	wrong := func() []string { return []string{fmt.Sprintf("%s = %v (%T): want %s", path, v, v, st.kind)} }
	switch st.kind {
	case kString:
		x, ok := v.(string)
		if !ok {
			return wrong()
		}
		return checkUnit(path, x, st.unit)
	case kInt:
		x, ok := v.(int64)
		if !ok {
			return wrong()
		}
		return checkUnit(path, x, st.unit)
	case kBool:
		if _, ok := v.(bool); !ok {
			return wrong()
		}
	case kStringOrArray:
		if x, ok := v.(string); ok {
			return checkUnit(path, x, st.unit)
		}
		fallthrough
	case kStringArray:
		xs, ok := v.([]any)
		if !ok {
			return wrong()
		}
		var problems []string
		for i, x := range xs {
			sx, ok := x.(string)
			if !ok {
				return wrong()
			}
			problems = append(problems, checkUnit(fmt.Sprintf("%s[%d]", path, i), sx, st.unit)...)
		}
		return problems
	case kStringTable, kIntTable, kBoolTable:
		m, ok := v.(map[string]any)
		if !ok {
			return wrong()
		}
		for _, x := range m {
			var ok bool
			switch st.kind {
			case kStringTable:
				_, ok = x.(string)
			case kIntTable:
				_, ok = x.(int64)
			default:
				_, ok = x.(bool)
			}
			if !ok {
				return wrong()
			}
		}
	case kTable:
		m, ok := v.(map[string]any)
		if !ok {
			return wrong()
		}
		if st.sub == nil {
			return []string{fmt.Sprintf("%s: its keys are not in this test's reference; add them from GitLab Runner's source before writing them", path)}
		}
		return checkTable(path, m, st.sub)
	case kTableArray:
		ms, ok := v.([]map[string]any)
		if !ok {
			return wrong()
		}
		if st.sub == nil {
			return []string{fmt.Sprintf("%s: its keys are not in this test's reference; add them from GitLab Runner's source before writing them", path)}
		}
		var problems []string
		for i, m := range ms {
			problems = append(problems, checkTable(fmt.Sprintf("%s[%d]", path, i), m, st.sub)...)
		}
		return problems
	}
	return nil
}

// checkUnit catches a value of the right type in the wrong unit: minutes where seconds
// are meant, bytes where KiB are, a bare number where a memory quantity needs a suffix.
func checkUnit(path string, v any, u unit) []string {
	bad := func(want string) []string { return []string{fmt.Sprintf("%s = %v: want %s", path, v, want)} }
	switch u {
	case seconds:
		// Milliseconds or nanoseconds of anything sensible are over a day.
		if n := v.(int64); n < 1 || n > 86400 {
			return bad("seconds, 1 to 86400")
		}
	case kib:
		if n := v.(int64); n < 1024 || n > 1<<20 {
			return bad("KiB, 1024 (1 MiB) to 1048576 (1 GiB)")
		}
	case millis:
		if n := v.(int64); n < 1 {
			return bad("milliseconds")
		}
	case cpu:
		q, err := resource.ParseQuantity(v.(string))
		if err != nil || q.MilliValue() < 1 || q.Value() > 1024 {
			return bad("a CPU quantity such as 500m or 2")
		}
	case bytes:
		q, err := resource.ParseQuantity(v.(string))
		if err != nil || q.Value() < 1<<20 {
			return bad("a memory quantity with a unit, such as 512Mi")
		}
	case duration:
		if _, err := time.ParseDuration(v.(string)); err != nil {
			return bad("a duration such as 5m")
		}
	case pullPolicies:
		if !slices.Contains([]string{"never", "if-not-present", "always"}, v.(string)) {
			return bad("never, if-not-present or always")
		}
	case selectorOp:
		if !slices.Contains([]string{"In", "NotIn", "Exists", "DoesNotExist"}, v.(string)) {
			return bad("In, NotIn, Exists or DoesNotExist")
		}
	}
	return nil
}

func node(cpus int64, mem string) NodeSize {
	return NodeSize{CPUs: cpus, Memory: resource.MustParse(mem), MaxPods: 110}
}

// defaultSettings: the defaults on the daemon's default node (1 vCPU, 1Gi).
func defaultSettings(t *testing.T) Settings {
	t.Helper()
	s, err := DefaultJobOptions().ForNode("ci", node(1, "1Gi"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func template(t *testing.T, o JobOptions, n NodeSize) string {
	t.Helper()
	s, err := o.ForNode("ci", n)
	if err != nil {
		t.Fatal(err)
	}
	b, err := credential().RunnerTemplate("/etc/gitlab-runner/ci/ca.crt", s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// everything turns every option on, so every key the generator can write is checked.
func everything() JobOptions {
	o := DefaultJobOptions()
	o.OneJobPerNode = true
	o.HelperImage = "registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper:x86_64-v${CI_RUNNER_VERSION}"
	o.JobCPU, o.JobMemory = "500m", "512Mi"
	return o
}

func TestTemplateKeysAreGitLabRunnerSettings(t *testing.T) {
	noServices := DefaultJobOptions()
	noServices.ServicesPerJob = 0
	tests := []struct {
		name   string
		text   func(t *testing.T) string
		reject string // a substring of one problem; "": none
	}{
		{"defaults on 1 vCPU, 1Gi", func(t *testing.T) string { return template(t, DefaultJobOptions(), node(1, "1Gi")) }, ""},
		{"every option, 2 vCPU, 2Gi", func(t *testing.T) string { return template(t, everything(), node(2, "2Gi")) }, ""},
		{"no service requests", func(t *testing.T) string { return template(t, noServices, node(4, "8Gi")) }, ""},
		{"no build cache", func(t *testing.T) string {
			c := credential()
			c.Cache = nil
			s, err := DefaultJobOptions().ForNode("ci", node(1, "1Gi"))
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.RunnerTemplate("/etc/gitlab-runner/ci/ca.crt", s)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "[runners.cache]\n") {
				t.Errorf("a template without a cache has [runners.cache]:\n%s", b)
			}
			return string(b)
		}, ""},
		{"a misspelt cache key", func(t *testing.T) string {
			return strings.Replace(template(t, DefaultJobOptions(), node(1, "1Gi")), "BucketName =", "Bucket =", 1)
		}, "runners.cache.s3.Bucket: not a GitLab Runner setting"},
		// The checker itself: each row breaks one thing it must catch.
		{"a misspelt key", func(t *testing.T) string {
			return strings.Replace(template(t, DefaultJobOptions(), node(1, "1Gi")), "poll_timeout =", "poll_timout =", 1)
		}, "runners.kubernetes.poll_timout: not a GitLab Runner setting"},
		{"a misspelt nested key", func(t *testing.T) string {
			return strings.Replace(template(t, everything(), node(2, "2Gi")), "topology_key =", "topologykey =", 1)
		}, "required_during_scheduling_ignored_during_execution[0].topologykey: not a GitLab Runner setting"},
		{"a key in the wrong table", func(t *testing.T) string {
			return strings.Replace(template(t, DefaultJobOptions(), node(1, "1Gi")), "    poll_interval =", "    output_limit = 51200\n    poll_interval =", 1)
		}, "runners.kubernetes.output_limit: not a GitLab Runner setting"},
		{"a string where the runner wants an integer", func(t *testing.T) string {
			return strings.Replace(template(t, DefaultJobOptions(), node(1, "1Gi")), "poll_timeout = 600", `poll_timeout = "600"`, 1)
		}, "runners.kubernetes.poll_timeout = 600 (string): want an integer"},
		{"milliseconds where the runner counts seconds", func(t *testing.T) string {
			return strings.Replace(template(t, DefaultJobOptions(), node(1, "1Gi")), "poll_timeout = 600", "poll_timeout = 600000", 1)
		}, "want seconds"},
		{"bytes where the runner counts KiB", func(t *testing.T) string {
			return strings.Replace(template(t, DefaultJobOptions(), node(1, "1Gi")), "output_limit = 51200", "output_limit = 52428800", 1)
		}, "want KiB"},
		{"a memory request without a unit", func(t *testing.T) string {
			return strings.Replace(template(t, DefaultJobOptions(), node(1, "1Gi")), `memory_request = "576Mi"`, `memory_request = "576"`, 1)
		}, "runners.kubernetes.memory_request = 576: want a memory quantity"},
		{"a pull policy the runner does not know", func(t *testing.T) string {
			return strings.Replace(template(t, DefaultJobOptions(), node(1, "1Gi")), `"if-not-present"`, `"IfNotPresent"`, 1)
		}, "want never, if-not-present or always"},
		{"two [[runners]]", func(t *testing.T) string {
			return template(t, DefaultJobOptions(), node(1, "1Gi")) + "[[runners]]\n  executor = \"kubernetes\"\n"
		}, "want exactly one [[runners]]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text := tt.text(t)
			problems := checkRunnerConfig(text)
			if tt.reject == "" {
				if len(problems) > 0 {
					t.Fatalf("GitLab Runner would not take this as meant:\n%s\n\n%s", strings.Join(problems, "\n"), text)
				}
				return
			}
			for _, p := range problems {
				if strings.Contains(p, tt.reject) {
					return
				}
			}
			t.Fatalf("problems %q, want one saying %q", problems, tt.reject)
		})
	}
}

// decode is the template as the runner reads it.
func decode(t *testing.T, text string) (runner, kube map[string]any) {
	t.Helper()
	var doc map[string]any
	if _, err := toml.Decode(text, &doc); err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	runner = doc["runners"].([]map[string]any)[0]
	return runner, runner["kubernetes"].(map[string]any)
}

func TestTemplateValues(t *testing.T) {
	type want map[string]any // key in [runners.kubernetes] (or "runners.KEY") -> value; nil: absent
	tests := []struct {
		name    string
		opts    func(*JobOptions)
		node    NodeSize
		want    want
		comment []string // the template says these
	}{
		{"defaults on 1 vCPU, 1Gi: one job Pod fills a node", func(*JobOptions) {}, node(1, "1Gi"), want{
			"runners.executor": "kubernetes", "runners.output_limit": int64(51200),
			"runners.feature_flags": map[string]any{"FF_PRINT_POD_EVENTS": true},
			"runners.cache": map[string]any{"Type": "s3", "Shared": true, "s3": map[string]any{
				"ServerAddress": "10.250.1.1:5001", "AccessKey": "sw-ci", "SecretKey": "5ec7e7", "BucketName": "sw-ci",
				"BucketLocation": "us-east-1", "Insecure": true}},
			"poll_timeout": int64(600), "poll_interval": int64(5), "pull_policy": "if-not-present",
			"cpu_request": "800m", "memory_request": "576Mi",
			"helper_cpu_request": "100m", "helper_memory_request": "128Mi",
			"service_cpu_request": "100m", "service_memory_request": "128Mi",
			"cpu_limit": nil, "helper_cpu_limit": nil, "memory_limit": nil, "helper_image": nil, "affinity": nil, "pod_labels": nil,
			"namespace": "gitlab-runner", "host": "https://10.250.1.1:7500",
		}, []string{"1 vCPU and 1Gi", "one job Pod per node, with up to one service:",
			"CPU: build 800m + helper 100m + 1 × service 100m = 1000m of the node's 1000m.",
			"Memory: build 576Mi + helper 128Mi + 1 × service 128Mi = 832Mi of the node's 832Mi.",
			"helper_cpu_limit = 1 alone", "2.1 CPU", "build cache for cluster ci", "--build-cache-budget", "4 MiB", "--node-boot-timeout (5m0s", "180 s", "--log-limit", "--poll-timeout",
			"--job-cpu, --job-memory", "--helper-image"}},
		{"2 vCPU, 2Gi", func(*JobOptions) {}, node(2, "2Gi"), want{
			"cpu_request": "1800m", "memory_request": "1536Mi",
		}, []string{"2 vCPU and 2Gi"}},
		{"two jobs per node split it", func(o *JobOptions) { o.JobsPerNode = 2 }, node(2, "2Gi"), want{
			"cpu_request": "800m", "memory_request": "640Mi",
		}, []string{"Sized for 2 job Pods per node", "CPU: 2 × (build 800m + helper 100m + 1 × service 100m) = 2000m of the node's 2000m."}},
		{"explicit requests, one job per node, helper image", func(o *JobOptions) { *o = everything() }, node(2, "2Gi"), want{
			"cpu_request": "500m", "memory_request": "512Mi",
			"helper_image": "registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper:x86_64-v${CI_RUNNER_VERSION}",
			"pod_labels":   map[string]any{JobLabel: "true"},
		}, []string{"--one-job-per-node", "kubernetes.io/hostname", "2 would fit a node, one is let on it"}},
		{"no services: no service requests", func(o *JobOptions) { o.ServicesPerJob = 0 }, node(1, "1Gi"), want{
			"service_cpu_request": nil, "service_memory_request": nil, "cpu_request": "900m", "memory_request": "704Mi",
		}, []string{"--services-per-job 0", "its services not counted", "CPU: build 900m + helper 100m = 1000m"}},
		{"poll and log settings", func(o *JobOptions) {
			o.PollTimeout, o.PollInterval, o.LogLimit = 15*time.Minute, 2*time.Second, "20Mi"
		}, node(1, "1Gi"), want{
			"poll_timeout": int64(900), "poll_interval": int64(2), "runners.output_limit": int64(20480),
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultJobOptions()
			tt.opts(&o)
			text := template(t, o, tt.node)
			if problems := checkRunnerConfig(text); len(problems) > 0 {
				t.Fatalf("not GitLab Runner settings: %q", problems)
			}
			runner, kube := decode(t, text)
			for k, w := range tt.want {
				table, key := kube, k
				if rk, ok := strings.CutPrefix(k, "runners."); ok {
					table, key = runner, rk
				}
				got, ok := table[key]
				switch {
				case w == nil && ok:
					t.Errorf("%s = %v, want it absent", k, got)
				case w != nil && fmt.Sprint(got) != fmt.Sprint(w):
					t.Errorf("%s = %#v, want %#v", k, got, w)
				}
			}
			for _, c := range tt.comment {
				if !strings.Contains(text, c) {
					t.Errorf("the template does not say %q:\n%s", c, text)
				}
			}
		})
	}
}

// The anti-affinity must select the label the job Pods get, on the node's hostname, or it
// is a rule that repels nothing.
func TestOneJobPerNodeSelectsTheJobLabel(t *testing.T) {
	_, kube := decode(t, template(t, everything(), node(2, "2Gi")))
	labels := kube["pod_labels"].(map[string]any)
	terms := kube["affinity"].(map[string]any)["pod_anti_affinity"].(map[string]any)["required_during_scheduling_ignored_during_execution"].([]map[string]any)
	if len(terms) != 1 {
		t.Fatalf("%d required anti-affinity terms, want 1", len(terms))
	}
	if terms[0]["topology_key"] != "kubernetes.io/hostname" {
		t.Errorf("topology_key %v, want kubernetes.io/hostname", terms[0]["topology_key"])
	}
	exprs := terms[0]["label_selector"].(map[string]any)["match_expressions"].([]map[string]any)
	if len(exprs) != 1 || exprs[0]["operator"] != "Exists" {
		t.Fatalf("match_expressions %v, want one Exists", exprs)
	}
	if _, ok := labels[exprs[0]["key"].(string)]; !ok {
		t.Errorf("the anti-affinity selects %v, which pod_labels %v does not put on job Pods", exprs[0]["key"], labels)
	}
	if strings.Contains(exprs[0]["key"].(string), "runner.gitlab.com") {
		t.Error("the runner refuses pod_labels in its own runner.gitlab.com namespace")
	}
}

func TestJobOptionsValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*JobOptions)
		want   []string // substrings of the error; none: valid
	}{
		{"defaults", func(*JobOptions) {}, nil},
		{"everything", func(o *JobOptions) { *o = everything() }, nil},
		{"shortest poll timeout", func(o *JobOptions) { o.PollTimeout = NodeBootDeadline }, nil},
		{"helper image with the runner's revision", func(o *JobOptions) { o.HelperImage = "localhost:5000/helper:x86_64-$CI_RUNNER_REVISION" }, nil},
		{"poll timeout shorter than a boot", func(o *JobOptions) { o.PollTimeout = time.Minute },
			[]string{"--poll-timeout 1m0s is shorter than a node boot", "5m0s..24h0m0s"}},
		{"the runner's default poll timeout", func(o *JobOptions) { o.PollTimeout = RunnerPollTimeout }, []string{"--poll-timeout 3m0s is shorter"}},
		{"poll timeout over a day", func(o *JobOptions) { o.PollTimeout = 25 * time.Hour }, []string{"longer than 24h0m0s"}},
		{"poll timeout in fractions", func(o *JobOptions) { o.PollTimeout = 10*time.Minute + time.Millisecond }, []string{"whole seconds, e.g. 10m0s"}},
		{"poll interval zero", func(o *JobOptions) { o.PollInterval = 0 }, []string{"--poll-interval 0s is outside 1s..1m0s"}},
		{"log limit in KiB, as the runner counts", func(o *JobOptions) { o.LogLimit = "51200" }, []string{`--log-limit "51200"`, "1Mi to 1Gi", "50Mi"}},
		{"log limit too big", func(o *JobOptions) { o.LogLimit = "2Gi" }, []string{"--log-limit"}},
		{"job cpu not a quantity", func(o *JobOptions) { o.JobCPU = "two" }, []string{`--job-cpu "two" is not a CPU request`, "500m"}},
		{"job memory without a unit", func(o *JobOptions) { o.JobMemory = "512" }, []string{`--job-memory "512" is not a memory request`, "512Mi"}},
		{"zero helper cpu", func(o *JobOptions) { o.HelperCPU = "0" }, []string{"--helper-cpu"}},
		{"negative service memory", func(o *JobOptions) { o.ServiceMemory = "-1Gi" }, []string{"--service-memory"}},
		{"services out of range", func(o *JobOptions) { o.ServicesPerJob = 9 }, []string{"--services-per-job 9 is outside 0..8"}},
		{"jobs per node zero", func(o *JobOptions) { o.JobsPerNode = 0 }, []string{"--jobs-per-node 0 is outside 1..64"}},
		{"one job per node, and two", func(o *JobOptions) { o.OneJobPerNode, o.JobsPerNode = true, 2 }, []string{"contradict"}},
		{"helper image with spaces", func(o *JobOptions) { o.HelperImage = "my helper" }, []string{`--helper-image "my helper" is not an image reference`}},
		{"every problem at once", func(o *JobOptions) { o.PollTimeout, o.LogLimit, o.JobCPU = 0, "x", "y" },
			[]string{"--poll-timeout", "--log-limit", "--job-cpu"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultJobOptions()
			tt.change(&o)
			err := o.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error saying %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to say %q", err, w)
				}
			}
		})
	}
}

func TestForNodeRefusesWhatNoNodeCanRun(t *testing.T) {
	tests := []struct {
		name   string
		change func(*JobOptions)
		node   NodeSize
		want   []string // substrings of the error; none: fits
	}{
		{"defaults fit the smallest default node", func(*JobOptions) {}, node(1, "1Gi"), nil},
		{"a build request of exactly the rest fits", func(o *JobOptions) { o.JobCPU, o.JobMemory = "1800m", "1536Mi" }, node(2, "2Gi"), nil},
		{"the seed's 2.1 CPU on a 2-vCPU node", func(o *JobOptions) { o.JobCPU, o.HelperCPU = "1", "1" }, node(2, "2Gi"),
			[]string{"a job Pod asks for 2100m CPU", "node of cluster ci has 2000m", "--job-cpu may be at most 900m", "--max-node-cpus"}},
		{"more memory than a node has", func(o *JobOptions) { o.JobMemory = "2Gi" }, node(2, "2Gi"),
			[]string{"a job Pod asks for 2304Mi of memory", "has 1792Mi Pods may ask for (2Gi less 256Mi", "--job-memory may be at most 1536Mi", "--max-node-memory"}},
		{"two jobs of a given size per node", func(o *JobOptions) { o.JobsPerNode, o.JobCPU = 2, "900m" }, node(2, "2Gi"),
			[]string{"2 job Pods per node (--jobs-per-node) ask for 2200m CPU", "at most 800m"}},
		{"helper and service leave nothing", func(o *JobOptions) { o.HelperCPU, o.ServiceCPU = "500m", "500m" }, node(1, "1Gi"),
			[]string{"leaves nothing for the build container", "--helper-cpu"}},
		{"too many services for the memory", func(o *JobOptions) { o.ServicesPerJob, o.ServiceMemory = 8, "128Mi" }, node(1, "1Gi"),
			[]string{"less than 4Mi for the build container"}},
		{"more jobs than Pods a node takes", func(o *JobOptions) { o.JobsPerNode, o.JobCPU, o.JobMemory = 64, "1m", "4Mi" }, NodeSize{CPUs: 64, Memory: resource.MustParse("64Gi"), MaxPods: 10},
			[]string{"--jobs-per-node 64 is more than the 10 Pods"}},
		{"a request up to the largest node of a sized cluster fits", func(o *JobOptions) { o.JobCPU, o.JobMemory = "3", "6Gi" }, sized(1, "1Gi", 4, "8Gi"), nil},
		{"a request beyond the largest node", func(o *JobOptions) { o.JobCPU = "5" }, sized(1, "1Gi", 4, "8Gi"),
			[]string{"the largest node of cluster ci has 4000m", "--job-cpu may be at most 3800m"}},
		{"a cluster without a node size", func(*JobOptions) {}, NodeSize{}, []string{"has no node size yet"}},
		{"a bad option is refused before the node is looked at", func(o *JobOptions) { o.PollTimeout = time.Second }, node(1, "1Gi"), []string{"--poll-timeout"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultJobOptions()
			tt.change(&o)
			s, err := o.ForNode("ci", tt.node)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("ForNode = %v, want it to fit", err)
				}
				cpuMilli, mem := tt.node.Largest().Schedulable()
				if int64(o.JobsPerNode)*s.PodCPUMilli > cpuMilli || int64(o.JobsPerNode)*s.PodMemory > mem {
					t.Errorf("accepted a Pod of %dm, %d bytes for a node with %dm, %d bytes", s.PodCPUMilli, s.PodMemory, cpuMilli, mem)
				}
				return
			}
			if err == nil {
				t.Fatalf("ForNode = %+v, want an error saying %q", s, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("ForNode = %q, want it to say %q", err, w)
				}
			}
		})
	}
}

func TestCheckOutDir(t *testing.T) {
	tests := []struct {
		name string
		dir  func(t *testing.T, base string) string
		want string // substring of the error; "": accepted
	}{
		{"an existing directory", func(t *testing.T, base string) string { return base }, ""},
		{"a directory to be made", func(t *testing.T, base string) string { return filepath.Join(base, "a", "b") }, ""},
		{"a file", func(t *testing.T, base string) string {
			f := filepath.Join(base, "f")
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return f
		}, "is a file, not a directory"},
		{"under a file", func(t *testing.T, base string) string {
			f := filepath.Join(base, "f")
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(f, "sub")
		}, "cannot be made: " + "F is a file"},
		{"a directory no one may write, not even root", func(t *testing.T, base string) string { return "/proc/socialweb-runner" }, "cannot write in /proc"},
		{"a read-only directory", func(t *testing.T, base string) string {
			if os.Geteuid() == 0 {
				t.Skip("root writes into a 0500 directory; the /proc row covers this as root")
			}
			d := filepath.Join(base, "ro")
			if err := os.Mkdir(d, 0o500); err != nil {
				t.Fatal(err)
			}
			return d
		}, "cannot write in"},
		{"empty", func(t *testing.T, base string) string { return "" }, "--out is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			dir := tt.dir(t, base)
			before := tree(t, base)
			_, err := CheckOutDir(dir)
			want := strings.ReplaceAll(tt.want, "F", filepath.Join(base, "f"))
			switch {
			case want == "" && err != nil:
				t.Fatalf("CheckOutDir(%s) = %v, want nil", dir, err)
			case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
				t.Fatalf("CheckOutDir(%s) = %v, want an error saying %q", dir, err, want)
			}
			if after := tree(t, base); !slices.Equal(before, after) {
				t.Errorf("CheckOutDir wrote: before %v, after %v", before, after)
			}
		})
	}
}

// tree lists every path under dir.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

func TestWriteOutDirReplacesFilesWhole(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runner")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// Files from an earlier run, longer than the new ones and too open.
	old := strings.Repeat("old ", 10000)
	for _, f := range []string{KubeconfigFile, CAFile, TemplateFile} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(old), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	cred := credential()
	if err := WriteOutDir(dir, cred, defaultSettings(t)); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{KubeconfigFile: 0o600, CAFile: 0o644, TemplateFile: 0o600} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || strings.Contains(string(b), "old") {
			t.Errorf("%s: %v, still holds old content: %v", name, err, strings.Contains(string(b), "old"))
		}
		if st, _ := os.Stat(filepath.Join(dir, name)); st.Mode().Perm() != mode {
			t.Errorf("%s mode %o, want %o", name, st.Mode().Perm(), mode)
		}
	}
	tmpl, _ := os.ReadFile(filepath.Join(dir, TemplateFile))
	if !strings.Contains(string(tmpl), `ca_file = "`+filepath.Join(dir, CAFile)+`"`) {
		t.Errorf("the template does not name the written ca.crt:\n%s", tmpl)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Errorf("%d entries in --out, want the 3 files and no temporaries: %v", len(entries), entries)
	}

	// A credential that cannot be rendered writes nothing: the old files stay whole.
	before, _ := os.ReadFile(filepath.Join(dir, KubeconfigFile))
	cred.Token = "a\nb"
	if err := WriteOutDir(dir, cred, defaultSettings(t)); err == nil {
		t.Fatal("WriteOutDir with a control character in the token succeeded")
	}
	after, _ := os.ReadFile(filepath.Join(dir, KubeconfigFile))
	if string(before) != string(after) {
		t.Error("a failed render changed the kubeconfig")
	}
	fresh := filepath.Join(t.TempDir(), "never")
	if err := WriteOutDir(fresh, cred, defaultSettings(t)); err == nil {
		t.Fatal("WriteOutDir with a control character in the token succeeded")
	}
	if _, err := os.Stat(fresh); err == nil {
		t.Error("a failed render made the --out directory")
	}
}

func sized(cpus int64, mem string, maxCPUs int64, maxMem string) NodeSize {
	return NodeSize{CPUs: cpus, Memory: resource.MustParse(mem), MaxCPUs: maxCPUs, MaxMemory: resource.MustParse(maxMem)}
}

// Derived requests fill the smallest node, so jobs that ask for nothing in particular
// still pack onto small nodes when the cluster may boot bigger ones.
func TestDerivedRequestsFillTheSmallestNode(t *testing.T) {
	s, err := DefaultJobOptions().ForNode("ci", sized(1, "1Gi", 4, "8Gi"))
	if err != nil {
		t.Fatal(err)
	}
	if s.BuildCPU.MilliValue() != 800 || s.BuildMemory.Value() != 576<<20 {
		t.Errorf("derived build requests %s / %s; want 800m / 576Mi (a 1 vCPU / 1Gi node's share)", s.BuildCPU.String(), s.BuildMemory.String())
	}
}
