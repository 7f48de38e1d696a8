package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/join"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

func csrHas(c *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) bool {
	for _, cond := range c.Status.Conditions {
		if cond.Type == typ {
			return true
		}
	}
	return false
}

// TestTenantAtZeroNodesCanAcceptNodes: a fresh tenant has no nodes, the
// default namespaces, RBAC and `kubernetes` Service, and the controllers a
// joining node needs: bootstrap-token auth, the bootstrap signer, the token
// cleaner, CSR approval and signing, and node IPAM.
func TestTenantAtZeroNodesCanAcceptNodes(t *testing.T) {
	d := newDaemon(t, 1)
	d.start()
	d.mustCLI("cluster", "create", "zero", "--wait")
	c := d.cluster("zero")
	cfg, k := d.tenant("zero")
	ctx := ctxT(t, 5*time.Minute)

	assertNoNodes := func() {
		t.Helper()
		nodes, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes.Items) != 0 {
			t.Fatalf("%d nodes, want 0", len(nodes.Items))
		}
	}
	assertNoNodes()
	// This daemon has no node image: the Cluster says so, and what to do.
	var nodeBoot *metav1.Condition
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "the NodeBoot condition to say there is no node image", func() bool {
		cl := d.cluster("zero")
		nodeBoot = meta.FindStatusCondition(cl.Status.Conditions, v1.ConditionNodeBoot)
		return nodeBoot != nil
	})
	if nodeBoot.Status != metav1.ConditionFalse || nodeBoot.Reason != "NoNodeImage" || !strings.Contains(nodeBoot.Message, "--node-image") {
		t.Errorf("NodeBoot condition %+v, want False NoNodeImage naming --node-image", *nodeBoot)
	}
	for _, ns := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
		if _, err := k.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			t.Errorf("namespace %s: %v", ns, err)
		}
	}
	for _, role := range []string{"cluster-admin", "system:node-bootstrapper", "system:certificates.k8s.io:certificatesigningrequests:nodeclient"} {
		if _, err := k.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{}); err != nil {
			t.Errorf("ClusterRole %s: %v", role, err)
		}
	}
	svc, err := k.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("kubernetes Service: %v", err)
	}
	if svc.Spec.ClusterIP != "10.251.0.1" {
		t.Errorf("kubernetes Service ClusterIP %s, want 10.251.0.1 (first of %s)", svc.Spec.ClusterIP, c.Status.ServiceCIDR)
	}

	// Bootstrap token: the signer signs cluster-info with it. Minted as the host
	// mints a node's: labelled with the one node it is for.
	tokenID, tokenSecret := "abcdef", "0123456789abcdef"
	_, err = k.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + tokenID, Labels: map[string]string{join.NodeLabel: "zero-probe"}},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": tokenID, "token-secret": tokenSecret,
			"usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
			"auth-extra-groups": "system:bootstrappers:socialweb",
			"expiration":        time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "bootstrap signer to sign cluster-info", func() bool {
		cm, err := k.CoreV1().ConfigMaps("kube-public").Get(ctx, "cluster-info", metav1.GetOptions{})
		return err == nil && cm.Data["jws-kubeconfig-"+tokenID] != ""
	})

	// The token authenticates. Its node-client CSR for another node's name (what a
	// Pod that read the identity disk would ask for) is denied; for its own node it
	// is approved and signed.
	bootCfg := rest.AnonymousClientConfig(cfg)
	bootCfg.BearerToken = tokenID + "." + tokenSecret
	boot := kubernetes.NewForConfigOrDie(bootCfg)
	nodeCSR := func(node string) string {
		t.Helper()
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		csrDER, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
			Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		}, key)
		csr, err := boot.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
			Spec: certificatesv1.CertificateSigningRequestSpec{
				Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}),
				SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
				Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating a CSR for %s with the bootstrap token: %v", node, err)
		}
		return csr.Name
	}
	stolen := nodeCSR("someone-else")
	var denied *certificatesv1.CertificateSigningRequest
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "the CSR for another node's name to be denied", func() bool {
		got, err := k.CertificatesV1().CertificateSigningRequests().Get(ctx, stolen, metav1.GetOptions{})
		if err == nil && csrHas(got, certificatesv1.CertificateDenied) {
			denied = got
		}
		return denied != nil
	})
	if csrHas(denied, certificatesv1.CertificateApproved) || len(denied.Status.Certificate) > 0 {
		t.Errorf("the CSR for someone-else was approved or signed: %+v", denied.Status)
	}
	own := nodeCSR("zero-probe")
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "the node CSR to be approved and signed", func() bool {
		got, err := k.CertificatesV1().CertificateSigningRequests().Get(ctx, own, metav1.GetOptions{})
		return err == nil && len(got.Status.Certificate) > 0
	})

	// Once its node registers, the token is gone: nothing after the join needs it.
	if _, err := k.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "zero-probe"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "the registered node's bootstrap token to be deleted", func() bool {
		_, err := k.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-"+tokenID, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err := k.CoreV1().Nodes().Delete(ctx, "zero-probe", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The token cleaner removes an expired token.
	_, err = k.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-expird"},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": "expird", "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true",
			"expiration": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "the token cleaner to delete an expired token", func() bool {
		_, err := k.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-expird", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})

	// Node IPAM hands a registered node a /24 of the cluster's pod CIDR.
	_, podNet, _ := net.ParseCIDR(c.Status.PodCIDR)
	if _, err := k.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ipam-probe"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var podCIDR string
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "node IPAM to assign a pod CIDR", func() bool {
		n, err := k.CoreV1().Nodes().Get(ctx, "ipam-probe", metav1.GetOptions{})
		if err == nil {
			podCIDR = n.Spec.PodCIDR
		}
		return podCIDR != ""
	})
	ip, sub, err := net.ParseCIDR(podCIDR)
	if err != nil || !podNet.Contains(ip) {
		t.Errorf("node pod CIDR %s not inside the cluster's %s", podCIDR, c.Status.PodCIDR)
	} else if ones, _ := sub.Mask.Size(); ones != 24 {
		t.Errorf("node pod CIDR %s is not a /24", podCIDR)
	}
	if err := k.CoreV1().Nodes().Delete(ctx, "ipam-probe", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 30*time.Second, 250*time.Millisecond, "the probe node to be gone", func() bool {
		_, err := k.CoreV1().Nodes().Get(ctx, "ipam-probe", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	assertNoNodes()
	if got := d.cluster("zero").Status.Phase; got != "Ready" {
		t.Errorf("phase %s after the checks, want Ready", got)
	}
}
