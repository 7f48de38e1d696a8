package main

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/images"
)

// A report shaped as e2e.test writes it (ginkgo's JUnit reporter: "[It] " names,
// status per spec, suite nodes as their own cases).
const sampleReport = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="7" disabled="0" errors="0" failures="1" time="100">
  <testsuite name="Kubernetes e2e suite" package="/" tests="7" disabled="0" skipped="4" errors="0" failures="1" time="100">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for the cluster [Conformance]" classname="Kubernetes e2e suite" status="passed" time="30"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for services [Conformance]" classname="Kubernetes e2e suite" status="failed" time="300">
      <failure type="failed">timed out</failure>
    </testcase>
    <testcase name="[It] [sig-network] EndpointSlice should create Endpoints and EndpointSlices for Pods matching a Service [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-node] Pods should do something [Serial] [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-storage] Volumes should work" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-node] Something with a feature [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped - Only supported for providers [gce]"></skipped>
    </testcase>
    <testcase name="[ReportAfterSuite] Kubernetes e2e JUnit report" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
  </testsuite>
</testsuites>`

func TestSummary(t *testing.T) {
	r, err := parseReport([]byte(sampleReport))
	if err != nil {
		t.Fatal(err)
	}
	s := sel{focus: `\[sig-network\]|\[sig-node\]`, labels: labelFilter,
		skipped: []skipReason{{`EndpointSlice should create Endpoints`, "needs registry.k8s.io/e2e-test-images/nginx:1.27.0-2 (not built)"}}}
	var out bytes.Buffer
	r.summary(s).print(&out)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		"conformance: 1 passed, 1 failed",
		"skipped: 2 in focus (reasons below), 2 not selected",
		"FAILED: [sig-network] DNS should provide DNS for services [Conformance]",
	}
	if len(lines) < len(want) || !slices.Equal(lines[:len(want)], want) {
		t.Fatalf("summary:\n%s\nwant it to start with:\n%s", out.String(), strings.Join(want, "\n"))
	}
	if !strings.Contains(out.String(), "SKIPPED: [sig-network] EndpointSlice should create Endpoints and EndpointSlices for Pods matching a Service [Conformance] -- needs registry.k8s.io/e2e-test-images/nginx") {
		t.Errorf("the nginx test's skip reason is missing:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "the test skipped itself: Only supported for providers [gce]") {
		t.Errorf("the test's own skip reason is missing:\n%s", out.String())
	}
}

func TestSelection(t *testing.T) {
	for _, tc := range []struct {
		c              config
		focus          string
		nodeTestsSkips bool
	}{
		// api mode boots nodes on demand: the webhook tests run.
		{config{mode: "api"}, `\[sig-api-machinery\]`, false},
		{config{mode: "nodes"}, `\[sig-network\]|\[sig-node\]`, false},
		{config{mode: "nodes", focus: `DNS|Services`}, `DNS|Services`, false},
	} {
		s := selection(tc.c)
		if s.focus != tc.focus {
			t.Errorf("%+v: focus %q, want %q", tc.c, s.focus, tc.focus)
		}
		re, err := regexp.Compile(s.skip)
		if err != nil {
			t.Fatalf("%+v: skip pattern does not compile: %v", tc.c, err)
		}
		webhook := "[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin] should mutate pod and apply defaults after mutation [Conformance]"
		if got := re.MatchString(webhook); got != tc.nodeTestsSkips {
			t.Errorf("%+v: skips the webhook test = %v, want %v", tc.c, got, tc.nodeTestsSkips)
		}
		// Its sample-apiserver and etcd images are built here.
		if re.MatchString("[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server using the current Aggregator [LinuxOnly] [Conformance]") {
			t.Errorf("%+v: the Aggregator test is skipped", tc.c)
		}
		if !re.MatchString("[sig-node] Pods should do something [Serial] [Conformance]") {
			t.Errorf("%+v: a [Serial] test is not skipped", tc.c)
		}
		if re.MatchString("[sig-network] DNS should provide DNS for the cluster [Conformance]") {
			t.Errorf("%+v: the DNS test is skipped", tc.c)
		}
	}
}

func TestE2EArgs(t *testing.T) {
	b := binaries{Kubectl: "/k/kubectl"}
	api := strings.Join(e2eArgs(config{mode: "api", timeout: time.Hour}, b, selection(config{mode: "api"}), "/kc", "/r"), " ")
	for _, want := range []string{"--allowed-not-ready-nodes=-1", "--num-nodes=0", "--provider=skeleton", "--kubeconfig=/kc",
		"--report-dir=/r", "--kubectl-path=/k/kubectl", "--ginkgo.timeout=1h0m0s", "--disable-log-dump"} {
		if !strings.Contains(api, want) {
			t.Errorf("api args lack %s: %s", want, api)
		}
	}
	nodes := strings.Join(e2eArgs(config{mode: "nodes", timeout: time.Hour}, b, selection(config{mode: "nodes"}), "/kc", "/r"), " ")
	if strings.Contains(nodes, "--num-nodes") || !strings.Contains(nodes, "--allowed-not-ready-nodes=0") {
		t.Errorf("nodes args: %s", nodes)
	}
}

func TestSuiteCommand(t *testing.T) {
	b := binaries{E2E: "/b/e2e.test", Ginkgo: "/b/ginkgo", Kubectl: "/k/kubectl"}
	for _, tc := range []struct {
		procs    int
		prog     string
		want     []string
		wantNot  []string
		e2eAfter bool // e2e.test's own flags come after "/b/e2e.test --"
	}{
		{1, "/b/e2e.test", []string{"--ginkgo.focus=", "--ginkgo.v", "--kubeconfig=/kc"}, []string{"--procs"}, false},
		{3, "/b/ginkgo", []string{"--procs=3", "--focus=", "--v", "--output-interceptor-mode=none", "/b/e2e.test --", "--kubeconfig=/kc"}, []string{"--ginkgo."}, true},
	} {
		c := config{mode: "nodes", timeout: time.Hour, procs: tc.procs}
		prog, args := suiteCommand(c, b, selection(c), "/kc", "/r")
		joined := strings.Join(args, " ")
		if prog != tc.prog {
			t.Errorf("procs %d: program %s, want %s", tc.procs, prog, tc.prog)
		}
		for _, w := range tc.want {
			if !strings.Contains(joined, w) {
				t.Errorf("procs %d: args lack %q: %s", tc.procs, w, joined)
			}
		}
		for _, w := range tc.wantNot {
			if strings.Contains(joined, w) {
				t.Errorf("procs %d: args have %q: %s", tc.procs, w, joined)
			}
		}
		if tc.e2eAfter && strings.Index(joined, "--kubeconfig") < strings.Index(joined, "/b/e2e.test --") {
			t.Errorf("procs %d: e2e.test's flags before its path: %s", tc.procs, joined)
		}
	}
}

func TestParseFlags(t *testing.T) {
	t.Setenv("SOCIALWEB_CONFORMANCE_MODE", "nodes")
	t.Setenv("SOCIALWEB_CONFORMANCE_NODES", "3")
	c, err := parseFlags([]string{"-image", "/img"})
	if err != nil {
		t.Fatal(err)
	}
	if c.mode != "nodes" || c.nodes != 3 || c.timeout != 10*time.Hour {
		t.Errorf("env defaults: %+v", c)
	}
	if c, err = parseFlags([]string{"-image", "/img", "-mode", "api"}); err != nil || c.mode != "api" || c.timeout != 2*time.Hour {
		t.Errorf("flag over env: %+v, %v", c, err)
	}
	for _, bad := range [][]string{{"-mode", "x", "-image", "/i"}, {"-nodes", "0", "-image", "/i"}, {}, {"-procs", "0", "-image", "/i"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if _, err := parseFlags([]string{"-build-only"}); err != nil {
		t.Errorf("-build-only without -image: %v", err)
	}
}

func TestPlaceholder(t *testing.T) {
	d := placeholder(3)
	if *d.Spec.Replicas != 3 {
		t.Fatalf("replicas %d", *d.Spec.Replicas)
	}
	aa := d.Spec.Template.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if len(aa) != 1 || aa[0].TopologyKey != "kubernetes.io/hostname" || aa[0].LabelSelector.MatchLabels["app"] != d.Spec.Template.Labels["app"] {
		t.Fatalf("anti-affinity: %+v", aa)
	}
	if ic := d.Spec.Template.Spec.InitContainers; len(ic) != len(prepulled()) || ic[0].Image != agnhostRef || ic[0].Command[0] != "/bin/sh" {
		t.Fatalf("init containers (the prepull): %+v", ic)
	}
	if c := d.Spec.Template.Spec.Containers[0]; c.Image != sandboxImage() || len(c.Resources.Requests) != 0 {
		t.Fatalf("container: %+v", c)
	}
}

func TestStagingVersion(t *testing.T) {
	for _, tc := range []struct {
		kver, want string
		ok         bool
	}{
		{"v1.37.2", "v0.37.2", true},
		{"v1.38.0-rc.1", "v0.38.0-rc.1", true},
		{"v2.0.0", "", false},
		{"v1.", "", false},
	} {
		got, err := stagingVersion(tc.kver)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("stagingVersion(%q) = %q, %v; want %q, ok %v", tc.kver, got, err, tc.want, tc.ok)
		}
	}
}

// The images' programs are built, static, and each image runs its program the way the
// Aggregator test asks: sample-apiserver as the entrypoint (the test gives arguments
// only), etcd at /usr/local/bin/etcd (the test gives the command).
func TestAggregatorImages(t *testing.T) {
	bins := binaries{KubeVersion: "v1.37.2", SampleAPIServer: "/b/sample-apiserver", Etcd: "/b/etcd", EtcdVersion: "v3.7.3"}
	steps := map[string]buildStep{}
	for _, s := range buildSteps("-X v") {
		if _, dup := steps[s.name]; dup {
			t.Fatalf("two steps build %s", s.name)
		}
		steps[s.name] = s
	}
	for _, tc := range []struct {
		spec       images.DebianSpec
		ref        string
		step, path string
		entrypoint []string
	}{
		{sampleAPIServerSpec(bins), "registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2", "sample-apiserver", "sample-apiserver", []string{"/sample-apiserver"}},
		{etcdSpec(bins), "registry.k8s.io/etcd:3.7.0-0", "etcd", "usr/local/bin/etcd", nil},
	} {
		t.Run(tc.step, func(t *testing.T) {
			if s, ok := steps[tc.step]; !ok || !s.static {
				t.Errorf("step %s: %+v, present %v; want a static build", tc.step, s, ok)
			}
			if !slices.Equal(tc.spec.Refs, []string{tc.ref}) || !tc.spec.Scratch {
				t.Errorf("refs %v scratch %v; want [%s], scratch", tc.spec.Refs, tc.spec.Scratch, tc.ref)
			}
			if !slices.Equal(tc.spec.Entrypoint, tc.entrypoint) {
				t.Errorf("entrypoint %v, want %v", tc.spec.Entrypoint, tc.entrypoint)
			}
			i := slices.IndexFunc(tc.spec.Files, func(f images.File) bool { return f.Path == tc.path })
			if i < 0 || tc.spec.Files[i].HostPath != "/b/"+tc.step || tc.spec.Files[i].Mode&0o111 == 0 {
				t.Errorf("files %+v: want /%s, executable, from /b/%s", tc.spec.Files, tc.path, tc.step)
			}
		})
	}
	for _, m := range missingImages() {
		if m.ref == sampleAPIServerRef || m.ref == etcdRef {
			t.Errorf("%s is built but listed as missing", m.ref)
		}
	}
}
