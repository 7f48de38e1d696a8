package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// Marks are empty files in a control plane's WorkDir that one run of it
// leaves for the daemon: each is removed when a run starts, so none outlives
// the run that earned it.

const (
	// upMark says the run has done its start-up work (ProbeUp).
	upMark = "up"
	// seededMark says the datastore held all the bootstrap hooks write before
	// they ran (ReadyzPath): this run wrote a whole seed into it, or a run of
	// this build finished the hooks on it (policyBuildFile).
	seededMark = "seeded"
)

// clearMarks removes every mark, as a run starts.
func clearMarks(cpDir string) error {
	for _, m := range []string{upMark, seededMark} {
		if err := clearMark(cpDir, m); err != nil {
			return err
		}
	}
	return nil
}

// hasMark is read by the daemon too: Lstat, since a tenant's run dir may hold a
// symlink or a FIFO by that name (either only says "marked").
func hasMark(cpDir, name string) bool {
	_, err := os.Lstat(filepath.Join(cpDir, name))
	return err == nil
}

func setMark(cpDir, name string) error {
	return os.WriteFile(filepath.Join(cpDir, name), nil, 0o600)
}

func clearMark(cpDir, name string) error {
	if err := os.Remove(filepath.Join(cpDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// upstreamObjects makes sure of what kube-apiserver's own controllers make
// right after it serves, which no readiness check covers: it waits for the
// system namespaces, and creates the kubernetes Service if it is not there
// yet. Upstream creates that Service only once the full /readyz answers, a
// second after serving (the bootstrap hooks' first poll), which a seeded
// control plane does not wait for; it is made here exactly as upstream makes
// it (first Service IP, 443 to the secure port), and upstream's controller
// then finds it and keeps its endpoints.
func upstreamObjects(ctx context.Context, kube kubernetes.Interface, c Config) error {
	svc, err := kubernetesService(c)
	if err != nil {
		return err
	}
	missing := func() (string, error) {
		for _, ns := range []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease} {
			if _, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return "namespace " + ns, nil
			} else if err != nil {
				return "", err
			}
		}
		// Get first: a create of an existing Service fails on its ClusterIP
		// ("already allocated", Invalid) before it can say AlreadyExists.
		services := kube.CoreV1().Services(metav1.NamespaceDefault)
		if _, err := services.Get(ctx, svc.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return "", err
		}
		if _, err := services.Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			if _, gerr := services.Get(ctx, svc.Name, metav1.GetOptions{}); gerr == nil {
				return "", nil // upstream's controller made it meanwhile
			}
			return "", fmt.Errorf("creating the kubernetes Service: %w", err)
		}
		return "", nil
	}
	deadline := time.Now().Add(time.Minute)
	for {
		what, err := missing()
		if err == nil && what == "" {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return err
			}
			return fmt.Errorf("%s does not exist a minute after the apiserver was ready", what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// kubernetesService is the Service upstream's kubernetesservice controller
// creates (CreateOrUpdateMasterServiceIfNeeded in k8s.io/kubernetes v1.37).
func kubernetesService(c Config) (*corev1.Service, error) {
	cidr, err := netip.ParsePrefix(c.ServiceCIDR)
	if err != nil {
		return nil, fmt.Errorf("service CIDR %q: %w", c.ServiceCIDR, err)
	}
	single := corev1.IPFamilyPolicySingleStack
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: "kubernetes", Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{"provider": "kubernetes", "component": "apiserver"},
		},
		Spec: corev1.ServiceSpec{
			Ports: []corev1.ServicePort{{
				Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(int32(c.Port)),
			}},
			ClusterIP:       cidr.Masked().Addr().Next().String(),
			IPFamilyPolicy:  &single,
			SessionAffinity: corev1.ServiceAffinityNone,
			Type:            corev1.ServiceTypeClusterIP,
		},
	}, nil
}
