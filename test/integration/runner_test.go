package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestRunnerCredential is what a CI admin wiring a GitLab Runner to a tenant does:
// `cluster runner-credential` mints a token whose Role allows exactly what the
// kubernetes executor does in its namespace (checked as `kubectl auth can-i` does, with
// SelfSubjectAccessReview, and by doing it), which another tenant refuses, which bad
// input never creates, and which --revoke ends.
func TestRunnerCredential(t *testing.T) {
	d := newDaemon(t, 2)
	d.start()
	d.mustCLI("cluster", "create", "ci", "--wait")
	d.mustCLI("cluster", "create", "other", "--wait")
	_, admin := d.tenant("ci")
	ctx := ctxT(t, 5*time.Minute)

	// Bad input: a clear error, non-zero exit, and nothing made in the cluster.
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ci", "--namespace", "kube-system"}, `"kube-system" belongs to the cluster`},
		{[]string{"ci", "--namespace", "Not_A_Label"}, "is not a DNS label"},
		{[]string{"ci", "--ttl", "1m"}, "ttl 1m0s is outside"},
		{[]string{"ci", "--revoke", "--out", t.TempDir()}, "--revoke and --out"},
		{[]string{"nosuch"}, `cluster "nosuch" not found`},
		{[]string{"ci", "--poll-timeout", "1m"}, "shorter than a node boot"},
		{[]string{"ci", "--log-limit", "4096"}, `--log-limit "4096"`},
		{[]string{"ci", "--job-cpu", "64"}, "a job Pod asks for"},
		{[]string{"ci", "--out", notADir}, "is a file, not a directory"},
	} {
		out, errOut, code := d.cli(append([]string{"cluster", "runner-credential"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Contains(out, "token") {
			t.Errorf("runner-credential %v: exit %d, stderr %q, stdout %q; want non-zero, an error saying %q and no credential", tc.args, code, errOut, out, tc.want)
		}
	}
	sas, err := admin.CoreV1().ServiceAccounts("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=gitlab-runner"})
	if err != nil || len(sas.Items) != 0 {
		t.Fatalf("bad input left service accounts %v (%v)", sas, err)
	}
	if _, err := admin.CoreV1().Namespaces().Get(ctx, "gitlab-runner", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("bad input made the runner namespace (get: %v)", err)
	}

	// Mint: files for `gitlab-runner register --template-config`.
	dir := filepath.Join(t.TempDir(), "runner")
	_, errOut, code := d.cli("cluster", "runner-credential", "ci", "--ttl", "1h", "--one-job-per-node", "--out", dir)
	if code != 0 {
		t.Fatalf("runner-credential ci --out: exit %d: %s", code, errOut)
	}
	t.Logf("runner-credential: %s", strings.TrimSpace(errOut))
	for name, mode := range map[string]os.FileMode{".": 0o700, "kubeconfig": 0o600, "config.template.toml": 0o600, "ca.crt": 0o644} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: %v, mode %v; want mode %o", name, err, st.Mode().Perm(), mode)
		}
	}
	template, _ := os.ReadFile(filepath.Join(dir, "config.template.toml"))
	url := d.cluster("ci").Status.URL
	for _, want := range []string{`executor = "kubernetes"`, `host = "` + url + `"`, `ca_file = "` + filepath.Join(dir, "ca.crt") + `"`, `namespace = "gitlab-runner"`, "bearer_token = ",
		"output_limit = 51200", "poll_timeout = 600", `pull_policy = "if-not-present"`, `cpu_request = "`, `helper_memory_request = "`,
		`topology_key = "kubernetes.io/hostname"`, "[runners.feature_flags]", "FF_PRINT_POD_EVENTS = true"} {
		if !strings.Contains(string(template), want) {
			t.Errorf("config.template.toml lacks %q:\n%s", want, template)
		}
	}
	runnerCfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	if len(runnerCfg.CertData) != 0 || runnerCfg.BearerToken == "" {
		t.Fatalf("the runner kubeconfig carries a client certificate or no token")
	}
	runner := kubernetes.NewForConfigOrDie(runnerCfg)

	// What the role says, as `kubectl auth can-i` asks it.
	canI := func(k kubernetes.Interface, verb, resource, sub, ns string) bool {
		t.Helper()
		r, err := k.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: verb, Resource: resource, Subresource: sub,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("can-i %s %s/%s in %q: %v", verb, resource, sub, ns, err)
		}
		return r.Status.Allowed
	}
	for _, tc := range []struct {
		verb, resource, sub, ns string
		want                    bool
	}{
		{"create", "pods", "", "gitlab-runner", true},
		{"watch", "pods", "", "gitlab-runner", true},
		{"delete", "pods", "", "gitlab-runner", true},
		{"create", "pods", "exec", "gitlab-runner", true},
		{"create", "pods", "attach", "gitlab-runner", true},
		{"get", "pods", "log", "gitlab-runner", true},
		{"create", "secrets", "", "gitlab-runner", true},
		{"update", "configmaps", "", "gitlab-runner", true},
		{"create", "services", "", "gitlab-runner", true},
		{"list", "events", "", "gitlab-runner", true},
		{"create", "pods", "", "default", false},
		{"create", "pods", "exec", "kube-system", false},
		{"list", "secrets", "", "gitlab-runner", false},
		{"get", "secrets", "", "kube-system", false},
		{"create", "rolebindings", "", "gitlab-runner", false},
		{"create", "serviceaccounts", "token", "gitlab-runner", false},
		{"list", "nodes", "", "", false},
		{"create", "namespaces", "", "", false},
		{"impersonate", "users", "", "", false},
	} {
		if got := canI(runner, tc.verb, tc.resource, tc.sub, tc.ns); got != tc.want {
			t.Errorf("runner can-i %s %s/%s in %q = %v, want %v", tc.verb, tc.resource, tc.sub, tc.ns, got, tc.want)
		}
	}
	// The admin's answer for a denied row is yes: the review is not just saying no.
	if !canI(admin, "list", "nodes", "", "") {
		t.Fatal("the admin cannot list nodes: SelfSubjectAccessReview answers no for everyone")
	}

	// And by doing it: a job Pod and its Secret in the namespace, nothing elsewhere.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "build", Image: "busybox:stable", Command: []string{"true"}}},
	}}
	if _, err := runner.CoreV1().Pods("gitlab-runner").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Errorf("the runner cannot create a job Pod in its namespace: %v", err)
	}
	if _, err := runner.CoreV1().Secrets("gitlab-runner").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "job-vars"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("the runner cannot create a Secret in its namespace: %v", err)
	}
	if err := runner.CoreV1().Pods("gitlab-runner").Delete(ctx, "job", metav1.DeleteOptions{}); err != nil {
		t.Errorf("the runner cannot delete its job Pod: %v", err)
	}
	// Job Pods run tenant CI code: the namespace holds them to Pod Security
	// "baseline", so a privileged one is refused until --privileged-jobs.
	privileged := true
	priv := pod.DeepCopy()
	priv.Name = "job-privileged"
	priv.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged}
	if _, err := runner.CoreV1().Pods("gitlab-runner").Create(ctx, priv, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "baseline") {
		t.Errorf("the runner creating a privileged job Pod: %v, want 403 naming PodSecurity baseline", err)
	}
	d.mustCLI("cluster", "runner-credential", "ci", "--ttl", "1h", "--privileged-jobs")
	if ns, err := admin.CoreV1().Namespaces().Get(ctx, "gitlab-runner", metav1.GetOptions{}); err != nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("after --privileged-jobs the namespace is %v (%v), want enforce=privileged", ns.Labels, err)
	}
	if _, err := runner.CoreV1().Pods("gitlab-runner").Create(ctx, priv, metav1.CreateOptions{}); err != nil {
		t.Errorf("with --privileged-jobs the runner cannot create a privileged job Pod: %v", err)
	} else if err := runner.CoreV1().Pods("gitlab-runner").Delete(ctx, priv.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting the privileged job Pod: %v", err)
	}
	d.mustCLI("cluster", "runner-credential", "ci", "--ttl", "1h")
	if ns, err := admin.CoreV1().Namespaces().Get(ctx, "gitlab-runner", metav1.GetOptions{}); err != nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "baseline" {
		t.Errorf("minting again without --privileged-jobs left the namespace %v (%v), want enforce=baseline", ns.Labels, err)
	}
	if _, err := runner.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("runner creating a Pod in default: %v, want 403 Forbidden", err)
	}
	if _, err := runner.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("runner listing nodes: %v, want 403 Forbidden", err)
	}

	// Another tenant refuses the token: its own signing key, its own CA.
	other := d.cluster("other")
	otherCfg, _ := d.tenant("other")
	cross := &rest.Config{Host: other.Status.URL, BearerToken: runnerCfg.BearerToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: otherCfg.CAData}}
	if _, err := kubernetes.NewForConfigOrDie(cross).CoreV1().Pods("gitlab-runner").List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Errorf("ci's runner token against cluster other: %v, want 401 Unauthorized", err)
	}

	// Minting again is idempotent (one ServiceAccount); revoking ends every token.
	d.mustCLI("cluster", "runner-credential", "ci")
	if sas, err := admin.CoreV1().ServiceAccounts("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=gitlab-runner"}); err != nil || len(sas.Items) != 1 {
		t.Errorf("after a second mint: %v service accounts named gitlab-runner (%v), want 1", len(sas.Items), err)
	}
	d.mustCLI("cluster", "runner-credential", "ci", "--revoke")
	livetest.Eventually(t, 30*time.Second, 200*time.Millisecond, "a revoked runner token to be refused", func() bool {
		_, err := runner.CoreV1().Pods("gitlab-runner").List(ctx, metav1.ListOptions{})
		return apierrors.IsUnauthorized(err)
	})
	if _, err := admin.CoreV1().Namespaces().Get(ctx, "gitlab-runner", metav1.GetOptions{}); err != nil {
		t.Errorf("revoke removed the runner's namespace: %v", err)
	}
}
