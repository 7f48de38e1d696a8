// Package join mints what one node needs to join its tenant cluster: a
// short-lived bootstrap token, registered in the tenant, the kubelet's client
// and serving certificates when the minter has the cluster's signer, and the
// identity document the guest agent reads from its identity disk.
package join

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/pki"
)

// DefaultTTL bounds how long a node may take to join; the token cleaner
// deletes the token after that.
const DefaultTTL = 15 * time.Minute

// BootstrapGroup is the extra group of socialweb's bootstrap tokens.
const BootstrapGroup = "system:bootstrappers:socialweb"

// Minter mints identities for one tenant cluster.
type Minter struct {
	Tenant    kubernetes.Interface
	APIServer string // https://<gateway>:<port>
	CACert    []byte // the tenant's server CA, PEM
	ClientCA  []byte // the tenant's client CA, PEM (signs the apiserver's kubelet client cert)
	Plan      nodenet.Plan
	Registry  string // http://<gateway>:<port>
	// NodeSigner issues each node's kubelet client and serving certificates (nil: the
	// kubelet bootstraps a client certificate with the token, and the agent makes a
	// self-signed serving certificate).
	NodeSigner *pki.NodeSigner
	TTL        time.Duration
	Now        func() time.Time
}

// Identity registers a bootstrap token for the node and returns its identity.
func (m Minter) Identity(ctx context.Context, req nodes.NodeRequest, addr net.IP, mac string) (identity.Identity, error) {
	now, ttl := time.Now, m.TTL
	if m.Now != nil {
		now = m.Now
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	id, secret := randomString(6), randomString(16)
	_, err := m.Tenant.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "bootstrap-token-" + id,
			Labels: map[string]string{NodeLabel: req.Name},
		},
		Type: corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"description":                    "socialweb node " + req.Name,
			"token-id":                       id,
			"token-secret":                   secret,
			"expiration":                     now().Add(ttl).UTC().Format(time.RFC3339),
			"usage-bootstrap-authentication": "true",
			"usage-bootstrap-signing":        "true",
			"auth-extra-groups":              BootstrapGroup,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return identity.Identity{}, fmt.Errorf("registering a bootstrap token for node %s: %w", req.Name, err)
	}
	ones, _ := m.Plan.NodeCIDR.Mask.Size()
	ident := identity.Identity{
		Cluster:        req.Cluster,
		NodeName:       req.Name,
		ProviderID:     nodes.ProviderID(req.Cluster, req.Name),
		APIServer:      m.APIServer,
		CACert:         string(m.CACert),
		ClientCACert:   string(m.ClientCA),
		BootstrapToken: id + "." + secret,
		Address:        addr.String() + "/" + strconv.Itoa(ones),
		Gateway:        m.Plan.Gateway.String(),
		DNS:            m.Plan.Gateway.String(),
		// Each node answers cluster DNS itself (internal/clusterdns in its agent).
		ClusterDNS: addr.String(),
		PodCIDR:    m.Plan.PodCIDR.String(),
		Registry:   m.Registry,
		MaxPods:    req.MaxPods,
		Labels:     req.Labels,
		MAC:        mac,
	}
	if m.NodeSigner != nil {
		cert, key, err := m.NodeSigner.NodeClientCert(req.Name, now())
		if err != nil {
			return identity.Identity{}, err
		}
		ident.KubeletClientCert, ident.KubeletClientKey = string(cert), string(key)
		// For addr: the node's InternalIP, which the apiserver dials.
		cert, key, err = m.NodeSigner.NodeServingCert(req.Name, addr, now())
		if err != nil {
			return identity.Identity{}, err
		}
		ident.KubeletServingCert, ident.KubeletServingKey = string(cert), string(key)
	}
	return ident, ident.Validate()
}

// randomString is n characters of [a-z0-9], the bootstrap token alphabet.
func randomString(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}
