package nodeservice

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/join"
	"github.com/socialweb-computer/socialweb/internal/lease"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// RegistryPort is where the host registry serves each cluster's nodes, on
// the cluster's gateway address.
const RegistryPort = 5000

// BuildCachePort is where the host's build cache (S3) serves each cluster's job
// Pods, on the cluster's gateway address.
const BuildCachePort = 5001

// BuildCacheAddr is where cluster's nodes reach the build cache: its gateway.
func BuildCacheAddr(plan nodenet.Plan) string {
	return net.JoinHostPort(plan.Gateway.String(), strconv.Itoa(BuildCachePort))
}

// Cluster is what a cluster's node services need.
type Cluster struct {
	Name string
	// UID is the Cluster object's: the incarnation its build cache credentials are
	// derived for.
	UID      string
	Tenant   kubernetes.Interface // admin client of the tenant
	Minter   join.Minter
	NodeSize scale.NodeSize
	// MaxNodeSize is the largest node; a field of 0 is NodeSize's (a fixed size).
	MaxNodeSize scale.NodeSize
	MaxNodes    int
	Hold        time.Duration
	// FreshNodePerJob: a node a CI job ran on is sealed and removed when the job ends.
	FreshNodePerJob bool
	// IdleNodes are kept up with nothing on them, within IdleSchedule (a window.Parse
	// text; "" is always).
	IdleNodes    int
	IdleSchedule string
	// RegistryAddr is where the host registry serves this cluster's nodes
	// (its gateway address); empty serves none.
	RegistryAddr string
	// DNSAddr is where the host's resolver is relayed to this cluster's nodes
	// (gateway:53): their own lookups and every name their cluster DNS forwards.
	// Empty serves none.
	DNSAddr string
	// BuildCacheAddr is where the build cache serves this cluster's job Pods (its
	// gateway address); the Host's BuildCache, if on, serves there.
	BuildCacheAddr string
}

// ClusterFrom assembles a Ready cluster's node services from its object, its
// lease and its dir (provider.ClusterDir: the tenant's admin kubeconfig and
// CAs, written when the control plane was prepared).
func ClusterFrom(c *v1.Cluster, l lease.Lease, dir string) (Cluster, error) {
	restCfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, pki.Daemon.Name+".kubeconfig"))
	if err != nil {
		return Cluster{}, fmt.Errorf("tenant credentials of %s: %w", c.Name, err)
	}
	tenant, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return Cluster{}, fmt.Errorf("tenant client of %s: %w", c.Name, err)
	}
	paths := controlplane.Config{Dir: dir}.PKI()
	ca, err := os.ReadFile(paths.ServerCA)
	if err != nil {
		return Cluster{}, fmt.Errorf("server CA of %s: %w", c.Name, err)
	}
	clientCA, err := os.ReadFile(paths.ClientCA)
	if err != nil {
		return Cluster{}, fmt.Errorf("client CA of %s: %w", c.Name, err)
	}
	signer, err := pki.LoadNodeSigner(paths)
	if err != nil {
		return Cluster{}, fmt.Errorf("node certificates of %s: %w", c.Name, err)
	}
	cl, err := clusterOf(c, l, tenant, ca, clientCA)
	if err != nil {
		return Cluster{}, err
	}
	cl.Minter.NodeSigner = signer
	return cl, nil
}

// clusterOf is ClusterFrom once the files are read: the spec's sizes and the
// gateway addresses the lease's network gives.
func clusterOf(c *v1.Cluster, l lease.Lease, tenant kubernetes.Interface, ca, clientCA []byte) (Cluster, error) {
	plan, err := nodenet.ForIndex(l.Network)
	if err != nil {
		return Cluster{}, fmt.Errorf("network plan of %s: %w", c.Name, err)
	}
	gw := plan.Gateway.String()
	s := c.Spec
	return Cluster{
		Name:   c.Name,
		UID:    string(c.UID),
		Tenant: tenant,
		Minter: join.Minter{
			Tenant: tenant, APIServer: fmt.Sprintf("https://%s:%d", gw, l.Port), CACert: ca, ClientCA: clientCA, Plan: plan,
			Registry: fmt.Sprintf("http://%s:%d", gw, RegistryPort),
		},
		NodeSize: scale.NodeSize{
			CPUs: int64(s.NodeCPUs), MemoryMiB: s.NodeMemory.Value() >> 20, DiskMiB: s.NodeDisk.Value() >> 20,
			MaxPods: int(s.PodsPerNode),
		},
		// A cluster from before sizes had a maximum has 0s here: a fixed size, as it was.
		MaxNodeSize: scale.NodeSize{
			CPUs: int64(s.MaxNodeCPUs), MemoryMiB: s.MaxNodeMemory.Value() >> 20, DiskMiB: s.MaxNodeDisk.Value() >> 20,
		},
		MaxNodes:        int(s.MaxNodes),
		Hold:            s.Hold.Duration,
		FreshNodePerJob: s.FreshNodePerJob,
		IdleNodes:       int(s.IdleNodes),
		IdleSchedule:    s.IdleSchedule,
		RegistryAddr:    fmt.Sprintf("%s:%d", gw, RegistryPort),
		DNSAddr:         net.JoinHostPort(gw, "53"),
		BuildCacheAddr:  BuildCacheAddr(plan),
	}, nil
}
