// Package ccm is socialweb's cloud-controller-manager: a k8s.io/cloud-provider
// implementation with InstancesV2 over the node provider, and the upstream
// cloud node and node lifecycle controllers that use it. It stamps each node's
// providerID and addresses, removes the storage startup taint once the kubelet has
// measured the node's disk, and removes Node objects whose microVM is gone.
package ccm

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	cloudprovider "k8s.io/cloud-provider"
	nodecontroller "k8s.io/cloud-provider/controllers/node"
	nodelifecycle "k8s.io/cloud-provider/controllers/nodelifecycle"
	controllersmetrics "k8s.io/component-base/metrics/prometheus/controllers"

	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// ProviderName is the cloud provider's name; kubelets run with
// --cloud-provider=external and nodes carry providerIDs socialweb://...
const ProviderName = "socialweb"

// Machines is what the cloud provider needs to know about microVMs.
type Machines interface {
	// Machine returns the machine behind a node and whether it exists.
	// An error means "unknown", never "gone".
	Machine(ctx context.Context, cluster, node string) (Machine, bool, error)
}

// Machine is one microVM as the cloud provider reports it.
type Machine struct {
	Address      net.IP
	InstanceType string
	Running      bool
}

// Cloud implements cloudprovider.Interface for one tenant cluster.
type Cloud struct {
	Cluster  string
	Machines Machines
}

var _ cloudprovider.Interface = (*Cloud)(nil)
var _ cloudprovider.InstancesV2 = (*Cloud)(nil)

func (c *Cloud) Initialize(cloudprovider.ControllerClientBuilder, <-chan struct{}) {}
func (c *Cloud) LoadBalancer() (cloudprovider.LoadBalancer, bool)                  { return nil, false }
func (c *Cloud) Instances() (cloudprovider.Instances, bool)                        { return nil, false }
func (c *Cloud) InstancesV2() (cloudprovider.InstancesV2, bool)                    { return c, true }
func (c *Cloud) Zones() (cloudprovider.Zones, bool)                                { return nil, false }
func (c *Cloud) Clusters() (cloudprovider.Clusters, bool)                          { return nil, false }
func (c *Cloud) Routes() (cloudprovider.Routes, bool)                              { return nil, false }
func (c *Cloud) ProviderName() string                                              { return ProviderName }
func (c *Cloud) HasClusterID() bool                                                { return true }

// machine resolves a Node to its machine, by providerID, else by name.
func (c *Cloud) machine(ctx context.Context, node *corev1.Node) (Machine, bool, error) {
	name := node.Name
	if node.Spec.ProviderID != "" {
		cluster, n, err := nodes.ParseProviderID(node.Spec.ProviderID)
		if err != nil {
			return Machine{}, false, err
		}
		if cluster != c.Cluster {
			// A node claiming another cluster's machine is not ours.
			return Machine{}, false, nil
		}
		name = n
	}
	return c.Machines.Machine(ctx, c.Cluster, name)
}

// InstanceExists reports whether the node's microVM exists.
func (c *Cloud) InstanceExists(ctx context.Context, node *corev1.Node) (bool, error) {
	_, ok, err := c.machine(ctx, node)
	return ok, err
}

// InstanceShutdown reports whether the node's microVM exists but has stopped.
func (c *Cloud) InstanceShutdown(ctx context.Context, node *corev1.Node) (bool, error) {
	m, ok, err := c.machine(ctx, node)
	if err != nil || !ok {
		return false, err
	}
	return !m.Running, nil
}

// InstanceMetadata is what the cloud node controller stamps on the Node.
func (c *Cloud) InstanceMetadata(ctx context.Context, node *corev1.Node) (*cloudprovider.InstanceMetadata, error) {
	m, ok, err := c.machine(ctx, node)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, cloudprovider.InstanceNotFound
	}
	md := &cloudprovider.InstanceMetadata{
		ProviderID:    nodes.ProviderID(c.Cluster, node.Name),
		InstanceType:  m.InstanceType,
		NodeAddresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: node.Name}},
	}
	if m.Address != nil {
		md.NodeAddresses = append([]corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: m.Address.String()}}, md.NodeAddresses...)
	}
	return md, nil
}

// Options tune the controllers; zero values take the defaults.
type Options struct {
	// MonitorPeriod is how often Nodes are checked against machines (default 5s).
	MonitorPeriod time.Duration
	// StatusUpdate is how often addresses are refreshed (default 1m).
	StatusUpdate time.Duration
	// Log gets the storage taint controller's lines (default slog.Default()).
	Log *slog.Logger
}

// Run runs the cloud node and node lifecycle controllers for one tenant
// until ctx ends.
func Run(ctx context.Context, kube kubernetes.Interface, cloud *Cloud, opts Options) error {
	if opts.MonitorPeriod == 0 {
		opts.MonitorPeriod = 5 * time.Second
	}
	if opts.StatusUpdate == 0 {
		opts.StatusUpdate = time.Minute
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	factory := informers.NewSharedInformerFactory(kube, 0)
	nodeInformer := factory.Core().V1().Nodes()
	nc, err := nodecontroller.NewCloudNodeController(nodeInformer, kube, cloud, opts.StatusUpdate, 2, 1)
	if err != nil {
		return fmt.Errorf("cloud node controller for %s: %w", cloud.Cluster, err)
	}
	lc, err := nodelifecycle.NewCloudNodeLifecycleController(nodeInformer, kube, cloud, opts.MonitorPeriod, 1)
	if err != nil {
		return fmt.Errorf("cloud node lifecycle controller for %s: %w", cloud.Cluster, err)
	}
	sc, err := newStorageController(kube, nodeInformer, opts.Log.With("cluster", cloud.Cluster))
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	metrics := controllersmetrics.NewControllerManagerMetrics("socialweb-ccm")
	go nc.RunWithContext(ctx, metrics)
	go lc.Run(ctx, metrics)
	go sc.run(ctx)
	<-ctx.Done()
	factory.Shutdown()
	return nil
}
