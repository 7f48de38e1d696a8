package gitlab

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/internal/buildcache"
)

// newCluster is a fake tenant whose namespaces get their "default" ServiceAccount on
// creation, as the controller-manager gives them.
func newCluster(objects ...runtime.Object) *fake.Clientset {
	kube := fake.NewClientset(objects...)
	kube.PrependReactor("create", "namespaces", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ns := a.(k8stesting.CreateAction).GetObject().(*corev1.Namespace)
		err := kube.Tracker().Add(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns.Name}})
		return false, nil, err
	})
	return kube
}

func valid() Grant {
	return Grant{Namespace: DefaultNamespace, Name: DefaultName, TTL: DefaultTTL}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Grant)
		want   []string // substrings of the error; none: valid
	}{
		{"defaults", func(*Grant) {}, nil},
		{"default namespace is allowed", func(g *Grant) { g.Namespace = "default" }, nil},
		{"shortest ttl", func(g *Grant) { g.TTL = MinTTL }, nil},
		{"kube-system", func(g *Grant) { g.Namespace = "kube-system" }, []string{`"kube-system" belongs to the cluster`, DefaultNamespace}},
		{"kube-node-lease", func(g *Grant) { g.Namespace = "kube-node-lease" }, []string{"belongs to the cluster"}},
		{"upper-case namespace", func(g *Grant) { g.Namespace = "CI" }, []string{`namespace "CI" is not a DNS label`}},
		{"empty name", func(g *Grant) { g.Name = "" }, []string{`name "" is not a DNS subdomain`}},
		{"ttl too short", func(g *Grant) { g.TTL = time.Minute }, []string{"ttl 1m0s is outside 10m0s.."}},
		{"ttl too long", func(g *Grant) { g.TTL = 2 * MaxTTL }, []string{"is outside"}},
		{"every problem at once", func(g *Grant) { g.Namespace, g.Name, g.TTL = "a_b", "x/y", 0 }, []string{"namespace", "name", "ttl"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := valid()
			tt.change(&g)
			err := g.Validate()
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

// allows reports whether rules grant verb on resource (core group) as RBAC reads them.
func allows(rules []rbacv1.PolicyRule, verb, resource string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

func TestRulesAreWhatTheExecutorNeedsAndNoMore(t *testing.T) {
	rules := Rules()
	for _, r := range rules {
		if slices.Contains(r.Verbs, "*") || slices.Contains(r.Resources, "*") || slices.Contains(r.APIGroups, "*") || len(r.NonResourceURLs) > 0 {
			t.Errorf("wildcard or non-resource rule %+v", r)
		}
		if !slices.Equal(r.APIGroups, []string{""}) {
			t.Errorf("rule outside the core group: %+v", r)
		}
	}
	tests := []struct {
		verb, resource string
		want           bool
	}{
		{"create", "pods", true},
		{"watch", "pods", true},
		{"delete", "pods", true},
		{"create", "pods/exec", true},
		{"create", "pods/attach", true},
		{"get", "pods/log", true},
		{"create", "secrets", true},
		{"delete", "configmaps", true},
		{"create", "services", true},
		{"get", "serviceaccounts", true},
		{"watch", "events", true},
		// Not granted: reading every Secret, changing the runner's own identity or
		// anything the executor does not do.
		{"list", "secrets", false},
		{"watch", "secrets", false},
		{"update", "pods", false},
		{"create", "serviceaccounts", false},
		{"create", "serviceaccounts/token", false},
		{"create", "persistentvolumeclaims", false},
		{"create", "pods/portforward", false},
		{"create", "events", false},
	}
	for _, tt := range tests {
		if got := allows(rules, tt.verb, tt.resource); got != tt.want {
			t.Errorf("%s %s allowed = %v, want %v", tt.verb, tt.resource, got, tt.want)
		}
	}
}

func TestApplyIsIdempotentAndResetsTheRole(t *testing.T) {
	ctx := context.Background()
	kube := newCluster()
	g := valid()
	if err := Apply(ctx, kube, g); err != nil {
		t.Fatal(err)
	}
	// Someone widens the role; applying again puts it back.
	role, _ := kube.RbacV1().Roles(g.Namespace).Get(ctx, g.Name, metav1.GetOptions{})
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}})
	if _, err := kube.RbacV1().Roles(g.Namespace).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(ctx, kube, g); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	role, _ = kube.RbacV1().Roles(g.Namespace).Get(ctx, g.Name, metav1.GetOptions{})
	if len(role.Rules) != len(Rules()) {
		t.Errorf("role has %d rules after a second Apply, want %d", len(role.Rules), len(Rules()))
	}
	rb, err := kube.RbacV1().RoleBindings(g.Namespace).Get(ctx, g.Name, metav1.GetOptions{})
	if err != nil || len(rb.Subjects) != 1 || rb.Subjects[0].Name != g.Name || rb.Subjects[0].Kind != rbacv1.ServiceAccountKind {
		t.Errorf("role binding %+v, %v; want one subject, the runner's ServiceAccount", rb, err)
	}
	if _, err := kube.CoreV1().ServiceAccounts(g.Namespace).Get(ctx, g.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("service account: %v", err)
	}
}

func TestApplyRefusesABindingToAnotherRole(t *testing.T) {
	ctx := context.Background()
	g := valid()
	kube := newCluster(&rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: g.Name, Namespace: g.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
	})
	err := Apply(ctx, kube, g)
	if err == nil || !strings.Contains(err.Error(), "refers to ClusterRole admin") {
		t.Fatalf("Apply = %v, want a refusal naming the other role", err)
	}
}

func TestBadInputTouchesNothing(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset()
	bad := Grant{Namespace: "kube-system", Name: DefaultName, TTL: DefaultTTL}
	if err := Apply(ctx, kube, bad); err == nil {
		t.Fatal("Apply into kube-system succeeded")
	}
	if err := Revoke(ctx, kube, bad); err == nil {
		t.Fatal("Revoke in kube-system succeeded")
	}
	if n := len(kube.Actions()); n != 0 {
		t.Errorf("bad input made %d API calls: %v", n, kube.Actions())
	}
}

func TestApplyWaitsForTheNamespacesDefaultServiceAccount(t *testing.T) {
	ctx := context.Background()
	// The namespace exists, its "default" ServiceAccount not yet (Pods would be refused).
	kube := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace}})
	arrived := make(chan struct{})
	go func() {
		time.Sleep(500 * time.Millisecond)
		_ = kube.Tracker().Add(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: DefaultNamespace}})
		close(arrived)
	}()
	if err := Apply(ctx, kube, valid()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	default:
		t.Fatal("Apply returned before the namespace had its default ServiceAccount")
	}
}

func TestMintTokenAsksForTheTTL(t *testing.T) {
	kube := fake.NewClientset()
	var asked int64
	expires := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	kube.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest)
		asked = *tr.Spec.ExpirationSeconds
		tr.Status = authenticationv1.TokenRequestStatus{Token: "tok", ExpirationTimestamp: metav1.NewTime(expires)}
		return true, tr, nil
	})
	g := valid()
	g.TTL = time.Hour
	token, exp, err := MintToken(context.Background(), kube, g)
	if err != nil || token != "tok" || !exp.Equal(expires) || asked != 3600 {
		t.Fatalf("MintToken = %q, %v, %v (asked %d s); want tok, %v, nil (asked 3600 s)", token, exp, err, asked, expires)
	}
}

func TestRevokeRemovesTheIdentityAndIsIdempotent(t *testing.T) {
	ctx := context.Background()
	kube := newCluster()
	g := valid()
	if err := Apply(ctx, kube, g); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := Revoke(ctx, kube, g); err != nil {
			t.Fatalf("Revoke: %v", err)
		}
	}
	if _, err := kube.CoreV1().ServiceAccounts(g.Namespace).Get(ctx, g.Name, metav1.GetOptions{}); err == nil {
		t.Error("the service account survived Revoke")
	}
	if _, err := kube.RbacV1().Roles(g.Namespace).Get(ctx, g.Name, metav1.GetOptions{}); err == nil {
		t.Error("the role survived Revoke")
	}
	if _, err := kube.CoreV1().Namespaces().Get(ctx, g.Namespace, metav1.GetOptions{}); err != nil {
		t.Errorf("Revoke removed the namespace (and what runs there): %v", err)
	}
}

func credential() Credential {
	return Credential{
		Grant:   valid(),
		Cluster: "ci",
		Server:  "https://10.250.1.1:7500",
		CA:      []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
		Token:   "eyJhbGciOi.payload.sig",
		Expires: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		Cache:   &buildcache.Access{Endpoint: "10.250.1.1:5001", Bucket: "sw-ci", AccessKey: "sw-ci", SecretKey: "5ec7e7"},
	}
}

func TestKubeconfig(t *testing.T) {
	c := credential()
	b, err := c.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		t.Fatalf("the kubeconfig does not load: %v", err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || ctx.Namespace != c.Namespace {
		t.Fatalf("current context %q = %+v, want namespace %s", cfg.CurrentContext, ctx, c.Namespace)
	}
	if cl := cfg.Clusters[ctx.Cluster]; cl == nil || cl.Server != c.Server || string(cl.CertificateAuthorityData) != string(c.CA) {
		t.Errorf("cluster entry %+v, want server %s and the CA embedded", cl, c.Server)
	}
	if ai := cfg.AuthInfos[ctx.AuthInfo]; ai == nil || ai.Token != c.Token || len(ai.ClientCertificateData) != 0 {
		t.Errorf("user entry %+v, want the token and no certificate", ai)
	}
	if cl := cfg.Clusters[ctx.Cluster]; cl == nil || cl.TLSServerName != "" {
		t.Errorf("cluster entry %+v: a server name the credential does not have", cl)
	}

	// The cluster's SNI name to ask for, through the front door (its address)
	// or on the cluster's own port, whose address is an IP: Go sends no SNI
	// for it, and a sleeping cluster wakes only for its name.
	for _, tc := range []struct {
		name, server string
		door         bool
	}{
		{"through the door", "https://127.0.0.1:8443", true},
		{"on its own port", "https://127.0.0.1:7500", false},
	} {
		c.Server, c.ServerName, c.Door = tc.server, "ci.socialweb.localhost", tc.door
		b, err = c.Kubeconfig()
		if err != nil {
			t.Fatal(err)
		}
		rc, err := clientcmd.RESTConfigFromKubeConfig(b)
		if err != nil {
			t.Fatal(err)
		}
		if rc.Host != c.Server || rc.TLSClientConfig.ServerName != c.ServerName {
			t.Errorf("%s the kubeconfig names %s as %q, want %s as %q", tc.name, rc.Host, rc.TLSClientConfig.ServerName, c.Server, c.ServerName)
		}
	}
}

func TestRunnerTemplate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Credential)
		caFile string
		want   []string
		err    string
	}{
		{"kubernetes executor section", func(*Credential) {}, "/etc/gitlab-runner/ci/ca.crt", []string{
			"[[runners]]\n  executor = \"kubernetes\"\n",
			"  [runners.kubernetes]\n    host = ",
			`    host = "https://10.250.1.1:7500"` + "\n",
			`    ca_file = "/etc/gitlab-runner/ci/ca.crt"` + "\n",
			`    bearer_token = "eyJhbGciOi.payload.sig"` + "\n",
			`    namespace = "gitlab-runner"` + "\n",
			"expires 2027-01-01T00:00:00Z",
		}, ""},
		{"through the front door the host is the cluster's SNI name", func(c *Credential) {
			c.Server, c.ServerName, c.Door = "https://127.0.0.1:8443", "ci.socialweb.localhost", true
		}, "/ca.crt", []string{
			`    host = "https://ci.socialweb.localhost:8443"` + "\n",
			"must resolve ci.socialweb.localhost to the door",
		}, ""},
		{"on its own port the host stays the address, and the comment says what wakes it", func(c *Credential) {
			c.Server, c.ServerName = "https://127.0.0.1:7500", "ci.socialweb.localhost"
		}, "/ca.crt", []string{
			`    host = "https://127.0.0.1:7500"` + "\n",
			"a sleeping cluster wakes only for a client that names it (ci.socialweb.localhost)",
		}, ""},
		{"quotes and backslashes are escaped", func(*Credential) {}, `/d"ir\x/ca.crt`, []string{`ca_file = "/d\"ir\\x/ca.crt"`}, ""},
		{"a control character is refused", func(c *Credential) { c.Token = "a\nb" }, "/ca.crt", nil, "control character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := credential()
			tt.change(&c)
			b, err := c.RunnerTemplate(tt.caFile, defaultSettings(t))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("RunnerTemplate err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("template lacks %q:\n%s", w, b)
				}
			}
			if strings.Contains(string(b), "url =") || strings.Contains(string(b), "token = \"glrt") {
				t.Errorf("template carries GitLab's url or runner token, which `register` adds:\n%s", b)
			}
		})
	}
}

// Job Pods run tenant CI code: the namespace holds them to Pod Security baseline
// unless privileged jobs were asked for, whether Apply makes the namespace or it
// was there before.
func TestApplySetsPodSecurity(t *testing.T) {
	ctx := context.Background()
	existing := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace, Labels: map[string]string{"team": "ci"}}}
	for _, tc := range []struct {
		name       string
		objects    []runtime.Object
		privileged bool
		want       string
	}{
		{"new namespace", nil, false, "baseline"},
		{"new namespace, privileged jobs", nil, true, "privileged"},
		{"namespace made by hand", []runtime.Object{existing.DeepCopy(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: DefaultNamespace}}}, false, "baseline"},
		{"namespace made by hand, privileged jobs", []runtime.Object{existing.DeepCopy(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: DefaultNamespace}}}, true, "privileged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := newCluster(tc.objects...)
			g := valid()
			g.PrivilegedJobs = tc.privileged
			if err := Apply(ctx, kube, g); err != nil {
				t.Fatal(err)
			}
			ns, err := kube.CoreV1().Namespaces().Get(ctx, g.Namespace, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != tc.want || ns.Labels["pod-security.kubernetes.io/enforce-version"] != "latest" {
				t.Errorf("namespace labels %v, want enforce=%s at version latest", ns.Labels, tc.want)
			}
			if len(tc.objects) > 0 && ns.Labels["team"] != "ci" {
				t.Errorf("the namespace's own labels were dropped: %v", ns.Labels)
			}
		})
	}
}

func TestRunnerTemplatePrivilegedJobs(t *testing.T) {
	for _, privileged := range []bool{false, true} {
		s := defaultSettings(t)
		s.PrivilegedJobs = privileged
		b, err := credential().RunnerTemplate("/ca.crt", s)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(b), "\n    privileged = true\n"); got != privileged {
			t.Errorf("privileged jobs %v: template says privileged = true: %v\n%s", privileged, got, b)
		}
	}
}
