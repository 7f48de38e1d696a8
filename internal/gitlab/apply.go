package gitlab

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Apply makes g's namespace (if missing), ServiceAccount, Role and RoleBinding in the
// tenant cluster. It is idempotent: a second run leaves one of each and puts the Role's
// rules back to Rules() if someone widened them. kube must be the tenant's admin.
func Apply(ctx context.Context, kube kubernetes.Interface, g Grant) error {
	if err := g.Validate(); err != nil {
		return err
	}
	ns, sa, role, rb := g.Objects()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		// A namespace made before (by hand, or by an older socialweb) gets the
		// Pod Security level too: job Pods run tenant CI code.
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{
			labelEnforce: g.PodSecurityLevel(), labelEnforceVersion: "latest",
		}}})
		if _, err := kube.CoreV1().Namespaces().Patch(ctx, g.Namespace, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("setting Pod Security %q on namespace %s: %w", g.PodSecurityLevel(), g.Namespace, err)
		}
	} else if err != nil {
		return fmt.Errorf("creating namespace %s: %w", g.Namespace, err)
	}
	if err := waitForDefaultServiceAccount(ctx, kube, g.Namespace); err != nil {
		return err
	}
	if _, err := kube.CoreV1().ServiceAccounts(g.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating service account %s/%s: %w", g.Namespace, g.Name, err)
	}
	roles := kube.RbacV1().Roles(g.Namespace)
	if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, err := roles.Get(ctx, g.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading role %s/%s: %w", g.Namespace, g.Name, err)
		}
		cur.Rules = role.Rules
		if _, err := roles.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("resetting role %s/%s: %w", g.Namespace, g.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("creating role %s/%s: %w", g.Namespace, g.Name, err)
	}
	bindings := kube.RbacV1().RoleBindings(g.Namespace)
	if _, err := bindings.Create(ctx, rb, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, err := bindings.Get(ctx, g.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading role binding %s/%s: %w", g.Namespace, g.Name, err)
		}
		// roleRef cannot change in place; subjects can.
		if cur.RoleRef != rb.RoleRef {
			return fmt.Errorf("role binding %s/%s exists and refers to %s %s, not this runner's role: delete it or choose another --name", g.Namespace, g.Name, cur.RoleRef.Kind, cur.RoleRef.Name)
		}
		cur.Subjects = rb.Subjects
		if _, err := bindings.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("resetting role binding %s/%s: %w", g.Namespace, g.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("creating role binding %s/%s: %w", g.Namespace, g.Name, err)
	}
	return nil
}

// defaultServiceAccountWait bounds the wait for the controller-manager to give a new
// namespace its "default" ServiceAccount.
const defaultServiceAccountWait = time.Minute

// waitForDefaultServiceAccount returns once ns has its "default" ServiceAccount: until
// then admission refuses every Pod there, so a runner handed the credential at once
// would fail its first job.
func waitForDefaultServiceAccount(ctx context.Context, kube kubernetes.Interface, ns string) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, defaultServiceAccountWait, true, func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("namespace %s has no default service account after %s (is the cluster's controller-manager running? `socialweb cluster get`): %w", ns, defaultServiceAccountWait, err)
	}
	return nil
}

// MintToken asks the tenant apiserver for a token of g's ServiceAccount valid for g.TTL,
// and returns it with the expiry the apiserver granted (it may shorten the request).
func MintToken(ctx context.Context, kube kubernetes.Interface, g Grant) (string, time.Time, error) {
	secs := int64(g.TTL / time.Second)
	tr, err := kube.CoreV1().ServiceAccounts(g.Namespace).CreateToken(ctx, g.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("minting a token for %s: %w", g.Username(), err)
	}
	return tr.Status.Token, tr.Status.ExpirationTimestamp.Time, nil
}

// Revoke deletes g's ServiceAccount, which invalidates every token minted for it, and
// its Role and RoleBinding. The namespace and what runs there stay. Revoking what does
// not exist is not an error.
func Revoke(ctx context.Context, kube kubernetes.Interface, g Grant) error {
	if err := asError(g.identityProblems()); err != nil {
		return err
	}
	steps := []struct {
		what string
		del  func() error
	}{
		{"service account", func() error {
			return kube.CoreV1().ServiceAccounts(g.Namespace).Delete(ctx, g.Name, metav1.DeleteOptions{})
		}},
		{"role binding", func() error {
			return kube.RbacV1().RoleBindings(g.Namespace).Delete(ctx, g.Name, metav1.DeleteOptions{})
		}},
		{"role", func() error { return kube.RbacV1().Roles(g.Namespace).Delete(ctx, g.Name, metav1.DeleteOptions{}) }},
	}
	for _, s := range steps {
		if err := s.del(); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s %s/%s: %w", s.what, g.Namespace, g.Name, err)
		}
	}
	return nil
}
