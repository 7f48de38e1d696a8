// Package identity is the contract between the host and a node's guest
// agent: everything a microVM needs to join its cluster, written by the host
// onto a small read-only disk and read by the agent at boot.
//
// The disk is raw: a JSON document followed by zero padding to a whole
// number of 512-byte sectors. No filesystem is needed to write or read it.
package identity

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
)

// MaxSize bounds the document; a larger disk is not an identity disk.
const MaxSize = 1 << 20

// DataDiskSerial is the virtio-blk serial of a node's container-storage disk: the host
// attaches the disk with it and the guest agent finds the disk by it.
const DataDiskSerial = "socialweb-data"

// StorageTaintKey is a startup taint (NoSchedule) a node registers with when it cannot
// say its ephemeral storage at registration (the agent then registers it with its
// storage, and no taint), and the host removes once the kubelet reports it. Without it
// the scheduler could bind a Pod that requests ephemeral storage while the kubelet's own
// view of its Node still lacks that capacity, and the kubelet's admission would fail the
// Pod.
const StorageTaintKey = "socialweb.computer/storage-unmeasured"

// KubeletNotReadyTaintKey is a startup taint (NoSchedule) the agent registers a Node
// with, and the host removes once the kubelet reports the node Ready. It keeps a Node
// registered with its capacity from being bound before its kubelet runs, without a
// registered Ready False condition (which starts the kubelet's 100 ms fast status loop
// from its first second).
const KubeletNotReadyTaintKey = "socialweb.computer/kubelet-not-ready"

// Identity is one node's join configuration.
type Identity struct {
	Cluster    string `json:"cluster"`
	NodeName   string `json:"nodeName"`   // unique per boot
	ProviderID string `json:"providerID"` // socialweb://<cluster>/<node>
	// APIServer is the tenant apiserver on the cluster's gateway address.
	APIServer string `json:"apiServer"`
	// CACert is the tenant's server CA (PEM).
	CACert string `json:"caCert"`
	// ClientCACert is the tenant's client CA (PEM): the kubelet verifies the apiserver's
	// kubelet-client certificate (logs, exec, port-forward) against it.
	ClientCACert string `json:"clientCACert"`
	// BootstrapToken is "<id>.<secret>", short-lived, for TLS bootstrap.
	BootstrapToken string `json:"bootstrapToken"`
	// KubeletClientCert and KubeletClientKey (PEM, both or neither) are the kubelet's
	// client certificate (system:node:<NodeName>) from the cluster's client CA, issued by
	// the host: the kubelet starts with them instead of a TLS bootstrap. Without them it
	// bootstraps with BootstrapToken.
	KubeletClientCert string `json:"kubeletClientCert,omitempty"`
	KubeletClientKey  string `json:"kubeletClientKey,omitempty"`
	// KubeletServingCert and KubeletServingKey (PEM, both or neither) are the kubelet's
	// serving certificate for NodeName and Address's IP from the cluster's server CA,
	// issued by the host: the tenant apiserver verifies the kubelet against that CA
	// (--kubelet-certificate-authority) for logs, exec and port-forward. Without them the
	// agent makes a self-signed one.
	KubeletServingCert string `json:"kubeletServingCert,omitempty"`
	KubeletServingKey  string `json:"kubeletServingKey,omitempty"`
	// Address is the node's address with prefix, e.g. 10.250.3.2/24.
	Address string `json:"address"`
	Gateway string `json:"gateway"`
	// DNS is the nameserver the node itself uses (the gateway's forwarder).
	DNS string `json:"dns"`
	// PodCIDR is the cluster's whole pod range (each node's share comes from node IPAM);
	// kube-proxy masquerades Service traffic from outside it.
	PodCIDR string `json:"podCIDR,omitempty"`
	// ClusterDNS is the Service IP Pods use for cluster DNS.
	ClusterDNS string `json:"clusterDNS"`
	// Registry is the host-side registry every image name is mirrored to,
	// e.g. http://10.250.3.1:5000.
	Registry string            `json:"registry"`
	MaxPods  int               `json:"maxPods"`
	Labels   map[string]string `json:"labels,omitempty"`
	// MAC of the node's network interface, to pick the right link.
	MAC string `json:"mac,omitempty"`
}

// Validate says what is missing or malformed.
func (id Identity) Validate() error {
	var errs []error
	need := func(name, v string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is empty", name))
		}
	}
	need("cluster", id.Cluster)
	need("nodeName", id.NodeName)
	need("providerID", id.ProviderID)
	need("apiServer", id.APIServer)
	need("caCert", id.CACert)
	need("clientCACert", id.ClientCACert)
	need("bootstrapToken", id.BootstrapToken)
	if (id.KubeletClientCert == "") != (id.KubeletClientKey == "") {
		errs = append(errs, errors.New("kubeletClientCert and kubeletClientKey go together: give both or neither"))
	}
	if (id.KubeletServingCert == "") != (id.KubeletServingKey == "") {
		errs = append(errs, errors.New("kubeletServingCert and kubeletServingKey go together: give both or neither"))
	}
	if _, _, err := net.ParseCIDR(id.Address); err != nil {
		errs = append(errs, fmt.Errorf("address %q is not an address/prefix", id.Address))
	}
	for name, v := range map[string]string{"gateway": id.Gateway, "dns": id.DNS} {
		if net.ParseIP(v) == nil {
			errs = append(errs, fmt.Errorf("%s %q is not an IP", name, v))
		}
	}
	if id.MaxPods <= 0 {
		errs = append(errs, fmt.Errorf("maxPods %d must be positive", id.MaxPods))
	}
	if len(errs) > 0 {
		return fmt.Errorf("identity of node %q: %w", id.NodeName, errors.Join(errs...))
	}
	return nil
}

// Encode writes the disk image: the JSON document padded to whole sectors.
func Encode(w io.Writer, id Identity) error {
	if err := id.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(id)
	if err != nil {
		return err
	}
	if len(b) >= MaxSize {
		return fmt.Errorf("identity of %s is %d bytes, over %d", id.NodeName, len(b), MaxSize)
	}
	pad := 512 - len(b)%512
	_, err = w.Write(append(b, make([]byte, pad)...))
	return err
}

// PoolDiskSize is the fixed size of a warm-pool VM's identity disk. The host rewrites
// the file in place when it hands the VM to a cluster, so the size never changes under
// the running VMM.
const PoolDiskSize = 64 << 10

// ErrUnclaimed is Decode's error for the identity disk of a warm-pool VM that no cluster
// has claimed yet: the agent waits and reads the disk again.
var ErrUnclaimed = errors.New("identity disk: a warm-pool VM not yet claimed by a cluster")

// Pool is what an unclaimed warm-pool VM is told besides that it waits to be claimed.
type Pool struct {
	// Prewarm: while it waits, the agent runs once each program a Pod's start runs, so
	// that the first Pod after the claim does not pay for their first run (agent.prewarm).
	Prewarm bool `json:"prewarm,omitempty"`
}

// poolDoc is the whole document of an unclaimed pool VM's disk.
type poolDoc struct {
	Pool    bool `json:"pool"`
	Prewarm bool `json:"prewarm,omitempty"`
}

// EncodePool writes the disk image of an unclaimed warm-pool VM: {"pool":true,...}
// padded with zeros to PoolDiskSize.
func EncodePool(w io.Writer, p Pool) error {
	b, err := json.Marshal(poolDoc{Pool: true, Prewarm: p.Prewarm})
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, make([]byte, PoolDiskSize-len(b))...))
	return err
}

// DecodePool reads the disk image of an unclaimed warm-pool VM (EncodePool); anything
// else is an error.
func DecodePool(r io.Reader) (Pool, error) {
	b, err := readDisk(r)
	if err != nil {
		return Pool{}, err
	}
	p, ok := poolOf(b)
	if !ok {
		return Pool{}, errors.New("identity disk holds no warm-pool document")
	}
	return p, nil
}

// readDisk reads a disk image without its zero padding.
func readDisk(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxSize))
	if err != nil {
		return nil, fmt.Errorf("reading identity disk: %w", err)
	}
	return bytes.TrimRight(b, "\x00"), nil
}

// poolOf reports whether b is a pool document, and what it says.
func poolOf(b []byte) (Pool, bool) {
	var doc poolDoc
	if json.Unmarshal(b, &doc) != nil || !doc.Pool {
		return Pool{}, false
	}
	return Pool{Prewarm: doc.Prewarm}, true
}

// EncodeSized writes the disk image of id padded with zeros to exactly size bytes (a
// pool VM's disk, rewritten in place on claim).
func EncodeSized(w io.Writer, id Identity, size int) error {
	if err := id.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(id)
	if err != nil {
		return err
	}
	if len(b) >= size || len(b) >= MaxSize {
		return fmt.Errorf("identity of %s is %d bytes, does not fit a %d-byte disk", id.NodeName, len(b), size)
	}
	_, err = w.Write(append(b, make([]byte, size-len(b))...))
	return err
}

// Decode reads a disk image written by Encode or EncodeSized. The disk of an unclaimed
// pool VM (EncodePool) gives ErrUnclaimed.
func Decode(r io.Reader) (Identity, error) {
	var id Identity
	b, err := readDisk(r)
	if err != nil {
		return id, err
	}
	if _, ok := poolOf(b); ok {
		return id, ErrUnclaimed
	}
	if err := json.Unmarshal(b, &id); err != nil {
		return id, fmt.Errorf("identity disk holds no identity document: %w", err)
	}
	return id, id.Validate()
}

// ForgetJoin returns the disk image disk without the join secret (the bootstrap token),
// the same size, for the host to write over a node's disk in place once the node has
// registered; changed is false when disk holds no identity with a token (a pool
// document, or one already forgotten). Decode refuses the result: the agent reads the
// disk only before it joins.
func ForgetJoin(disk []byte) (out []byte, changed bool, err error) {
	b := bytes.TrimRight(disk, "\x00")
	if _, ok := poolOf(b); ok {
		return disk, false, nil
	}
	var id Identity
	if err := json.Unmarshal(b, &id); err != nil {
		return nil, false, fmt.Errorf("identity disk holds no identity document: %w", err)
	}
	if id.BootstrapToken == "" {
		return disk, false, nil
	}
	id.BootstrapToken = ""
	nb, err := json.Marshal(id)
	if err != nil {
		return nil, false, err
	}
	if len(nb) > len(disk) {
		return nil, false, fmt.Errorf("identity of %s without its token is %d bytes, over the disk's %d", id.NodeName, len(nb), len(disk))
	}
	return append(nb, make([]byte, len(disk)-len(nb))...), true, nil
}

// HoldsJoinSecret reports whether disk (an image, or what a guest read of its disk) is an
// identity that still carries its bootstrap token.
func HoldsJoinSecret(disk []byte) bool {
	var doc struct {
		BootstrapToken string `json:"bootstrapToken"`
	}
	return json.Unmarshal(bytes.TrimRight(disk, "\x00"), &doc) == nil && doc.BootstrapToken != ""
}
