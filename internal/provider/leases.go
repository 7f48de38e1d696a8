package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/lease"
)

// leaseConfigMap holds the lease table in the management API's datastore, so
// a lease outlives daemon restarts and is written with optimistic concurrency.
const leaseConfigMap = "leases"

type leaseStore struct {
	kube     kubernetes.Interface
	ports    lease.Range
	networks lease.Range
}

func (s leaseStore) load(ctx context.Context) (*corev1.ConfigMap, lease.Table, error) {
	cm, err := s.kube.CoreV1().ConfigMaps(v1.SystemNamespace).Get(ctx, leaseConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm, err = s.kube.CoreV1().ConfigMaps(v1.SystemNamespace).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: leaseConfigMap, Namespace: v1.SystemNamespace},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading lease table: %w", err)
	}
	t := lease.Table{}
	for name, raw := range cm.Data {
		var l lease.Lease
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			return nil, nil, fmt.Errorf("lease of %s is corrupt (%q): %w", name, raw, err)
		}
		t[name] = l
	}
	return cm, t, nil
}

func (s leaseStore) save(ctx context.Context, cm *corev1.ConfigMap, t lease.Table) error {
	cm = cm.DeepCopy()
	cm.Data = map[string]string{}
	for name, l := range t {
		b, _ := json.Marshal(l)
		cm.Data[name] = string(b)
	}
	_, err := s.kube.CoreV1().ConfigMaps(v1.SystemNamespace).Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

// Get returns a cluster's lease, or nil.
func (s leaseStore) Get(ctx context.Context, cluster string) (*lease.Lease, error) {
	_, t, err := s.load(ctx)
	if err != nil {
		return nil, err
	}
	if l, ok := t[cluster]; ok {
		return &l, nil
	}
	return nil, nil
}

// Acquire returns the cluster's lease, allocating what it lacks (a new
// cluster's port and network, a woken cluster's network).
func (s leaseStore) Acquire(ctx context.Context, cluster string) (lease.Lease, error) {
	var got lease.Lease
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, t, err := s.load(ctx)
		if err != nil {
			return err
		}
		before := t[cluster]
		got, err = t.Acquire(cluster, s.ports, s.networks, portFree)
		if err != nil {
			return err
		}
		if got == before { // held already: nothing to write
			return nil
		}
		return s.save(ctx, cm, t)
	})
	return got, err
}

// Release drops a cluster's lease.
func (s leaseStore) Release(ctx context.Context, cluster string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, t, err := s.load(ctx)
		if err != nil {
			return err
		}
		if _, ok := t[cluster]; !ok {
			return nil
		}
		t.Release(cluster)
		return s.save(ctx, cm, t)
	})
}

// ReleaseNetwork gives back a cluster's node network; its port stays leased.
func (s leaseStore) ReleaseNetwork(ctx context.Context, cluster string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, t, err := s.load(ctx)
		if err != nil {
			return err
		}
		before := t[cluster]
		t.ReleaseNetwork(cluster)
		if t[cluster] == before {
			return nil
		}
		return s.save(ctx, cm, t)
	})
}

// portFree reports whether nothing on the host listens on the loopback port.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
