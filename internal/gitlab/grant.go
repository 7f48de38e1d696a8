// Package gitlab is what a GitLab Runner (kubernetes executor) gets from a tenant
// cluster: a ServiceAccount in one namespace, a Role with exactly the permissions the
// executor uses there, and a time-bound token for it, handed over as a kubeconfig or a
// config.toml fragment.
//
// A ServiceAccount token rather than a client certificate: the tenant's client CA has no
// revocation, while deleting the ServiceAccount invalidates every token minted for it at
// once. A Role rather than a ClusterRole: a runner never needs another namespace, nodes
// or RBAC, so a leaked credential cannot reach them either.
package gitlab

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Defaults a CI admin gets without saying otherwise.
const (
	DefaultNamespace = "gitlab-runner"
	DefaultName      = "gitlab-runner"
	DefaultTTL       = 30 * 24 * time.Hour
	// MinTTL is the TokenRequest API's own lower bound.
	MinTTL = 10 * time.Minute
	// MaxTTL bounds how long a leaked token stays useful; re-minting is one command.
	MaxTTL = 366 * 24 * time.Hour
)

// managedBy labels every object this package makes, so an operator can find them.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "socialweb"
)

// isSystemNamespace: these hold the cluster's own machinery; exec and secrets there
// would be cluster-admin in all but name.
func isSystemNamespace(ns string) bool {
	switch ns {
	case metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease:
		return true
	}
	return false
}

// Grant names the runner's identity in a tenant cluster.
type Grant struct {
	Namespace string // where the runner's job Pods run
	Name      string // the ServiceAccount, Role and RoleBinding
	TTL       time.Duration
	// PrivilegedJobs lets job Pods run privileged (docker-in-docker): the
	// namespace enforces Pod Security "privileged" instead of "baseline".
	PrivilegedJobs bool
}

// Pod Security admission labels on the job namespace.
const (
	labelEnforce        = "pod-security.kubernetes.io/enforce"
	labelEnforceVersion = "pod-security.kubernetes.io/enforce-version"
)

// PodSecurityLevel is the Pod Security level job Pods are held to.
func (g Grant) PodSecurityLevel() string {
	if g.PrivilegedJobs {
		return "privileged"
	}
	return "baseline"
}

// namespaceLabels are the labels Apply sets on the job namespace.
func (g Grant) namespaceLabels() map[string]string {
	return map[string]string{
		labelManagedBy:      managedBy,
		labelEnforce:        g.PodSecurityLevel(),
		labelEnforceVersion: "latest",
	}
}

// Validate says what is wrong with g and what would be right.
func (g Grant) Validate() error {
	problems := g.identityProblems()
	if g.TTL < MinTTL || g.TTL > MaxTTL {
		problems = append(problems, fmt.Sprintf("ttl %s is outside %s..%s", g.TTL, MinTTL, MaxTTL))
	}
	return asError(problems)
}

// identityProblems are what is wrong with g's namespace and name.
func (g Grant) identityProblems() []string {
	var problems []string
	if errs := validation.IsDNS1123Label(g.Namespace); len(errs) > 0 {
		problems = append(problems, fmt.Sprintf("namespace %q is not a DNS label (%s)", g.Namespace, strings.Join(errs, "; ")))
	}
	if isSystemNamespace(g.Namespace) {
		problems = append(problems, fmt.Sprintf("namespace %q belongs to the cluster itself: give the runner its own, e.g. %q", g.Namespace, DefaultNamespace))
	}
	if errs := validation.IsDNS1123Subdomain(g.Name); len(errs) > 0 {
		problems = append(problems, fmt.Sprintf("name %q is not a DNS subdomain (%s)", g.Name, strings.Join(errs, "; ")))
	}
	return problems
}

func asError(problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("runner credential: %s", strings.Join(problems, "; "))
}

// Rules are what the kubernetes executor does in its namespace: create a job Pod, wait
// for it (watch, events), attach and exec into its containers, read their logs, keep
// the job's variables and registry credentials in Secrets and ConfigMaps, expose
// services, and clean all of that up. Nothing else: no list on Secrets, nothing
// cluster-scoped, no RBAC.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods/exec", "pods/attach"}, Verbs: []string{"get", "create", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"secrets", "configmaps"}, Verbs: []string{"get", "create", "update", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "create", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list", "watch"}},
	}
}

// Objects are what Apply makes for g, in creation order.
func (g Grant) Objects() (*corev1.Namespace, *corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding) {
	labels := map[string]string{labelManagedBy: managedBy}
	meta := metav1.ObjectMeta{Name: g.Name, Namespace: g.Namespace, Labels: labels}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: g.Namespace, Labels: g.namespaceLabels()}}
	sa := &corev1.ServiceAccount{ObjectMeta: meta}
	role := &rbacv1.Role{ObjectMeta: meta, Rules: Rules()}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: meta,
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: g.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: g.Name, Namespace: g.Namespace}},
	}
	return ns, sa, role, rb
}

// Username is how the tenant's apiserver names the runner (for RBAC and audit).
func (g Grant) Username() string {
	return "system:serviceaccount:" + g.Namespace + ":" + g.Name
}
