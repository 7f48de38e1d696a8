package nodeservice

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/lease"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

func TestClusterOf(t *testing.T) {
	base := v1.ClusterSpec{
		MaxNodes: 3, Hold: metav1.Duration{Duration: 2 * time.Minute},
		NodeCPUs: 2, NodeMemory: resource.MustParse("2Gi"), NodeDisk: resource.MustParse("10Gi"), PodsPerNode: 110,
	}
	ranged := base
	ranged.MaxNodeCPUs, ranged.MaxNodeMemory, ranged.MaxNodeDisk = 8, resource.MustParse("16Gi"), resource.MustParse("50Gi")
	diskless := base
	diskless.NodeDisk = resource.Quantity{}
	for _, tc := range []struct {
		name              string
		spec              v1.ClusterSpec
		wantSize, wantMax scale.NodeSize
	}{
		{"sizes from the spec", ranged,
			scale.NodeSize{CPUs: 2, MemoryMiB: 2048, DiskMiB: 10240, MaxPods: 110}, scale.NodeSize{CPUs: 8, MemoryMiB: 16384, DiskMiB: 51200}},
		// A cluster from before sizes had a maximum: a fixed size.
		{"old cluster without maximums", base,
			scale.NodeSize{CPUs: 2, MemoryMiB: 2048, DiskMiB: 10240, MaxPods: 110}, scale.NodeSize{}},
		{"nodes without a disk", diskless,
			scale.NodeSize{CPUs: 2, MemoryMiB: 2048, MaxPods: 110}, scale.NodeSize{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tenant := kubefake.NewSimpleClientset()
			c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci", UID: "uid-ci"}, Spec: tc.spec}
			got, err := clusterOf(c, lease.Lease{Port: 6500, Network: 7}, tenant, []byte("CA"), []byte("CLIENT CA"))
			if err != nil {
				t.Fatal(err)
			}
			if got.NodeSize != tc.wantSize || got.MaxNodeSize != tc.wantMax {
				t.Errorf("sizes = %+v .. %+v, want %+v .. %+v", got.NodeSize, got.MaxNodeSize, tc.wantSize, tc.wantMax)
			}
			if got.Name != "ci" || got.UID != "uid-ci" || got.MaxNodes != 3 || got.Hold != 2*time.Minute || got.Tenant != tenant {
				t.Errorf("cluster = %+v", got)
			}
			m := got.Minter
			if m.APIServer != "https://10.250.7.1:6500" || m.Registry != "http://10.250.7.1:5000" || m.Plan.Index != 7 ||
				string(m.CACert) != "CA" || string(m.ClientCA) != "CLIENT CA" || m.Tenant != tenant {
				t.Errorf("minter = %+v", m)
			}
			if got.RegistryAddr != "10.250.7.1:5000" || got.DNSAddr != "10.250.7.1:53" || got.BuildCacheAddr != "10.250.7.1:5001" {
				t.Errorf("registry %s, DNS %s, build cache %s: want them on the gateway", got.RegistryAddr, got.DNSAddr, got.BuildCacheAddr)
			}
		})
	}
}

func TestClusterFromErrors(t *testing.T) {
	c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}}
	for _, tc := range []struct {
		name  string
		lease lease.Lease
		dir   string
		want  string
	}{
		{"no kubeconfig", lease.Lease{Port: 6500, Network: 7}, t.TempDir(), "tenant credentials of ci"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ClusterFrom(c, tc.lease, tc.dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ClusterFrom = %v, want an error saying %q", err, tc.want)
			}
		})
	}
	if _, err := clusterOf(c, lease.Lease{Port: 6500}, kubefake.NewSimpleClientset(), nil, nil); err == nil || !strings.Contains(err.Error(), "network plan of ci") {
		t.Errorf("a lease without a network: %v", err)
	}
}
