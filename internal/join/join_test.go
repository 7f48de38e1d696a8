package join

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"regexp"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/pki"
)

func TestIdentityRegistersAShortLivedToken(t *testing.T) {
	plan, _ := nodenet.ForIndex(3)
	kube := fake.NewSimpleClientset()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	m := Minter{Tenant: kube, APIServer: "https://10.250.3.1:7500", CACert: []byte("PEM"), ClientCA: []byte("CLIENT PEM"), Plan: plan,
		Registry: "http://10.250.3.1:5000", TTL: 10 * time.Minute, Now: func() time.Time { return now }}
	req := nodes.NodeRequest{Cluster: "ci", Name: "ci-abc", CPUs: 1, MemoryMiB: 1024, MaxPods: 110, Labels: map[string]string{"x": "y"}}
	id, err := m.Identity(context.Background(), req, net.ParseIP("10.250.3.2"), "02:00:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`).MatchString(id.BootstrapToken) {
		t.Errorf("token %q is not a bootstrap token", id.BootstrapToken)
	}
	if id.Address != "10.250.3.2/24" || id.Gateway != "10.250.3.1" || id.ClusterDNS != "10.250.3.2" || id.PodCIDR != "10.3.0.0/16" || id.ProviderID != "socialweb://ci/ci-abc" {
		t.Errorf("identity = %+v", id)
	}
	secrets, _ := kube.CoreV1().Secrets(metav1.NamespaceSystem).List(context.Background(), metav1.ListOptions{})
	if len(secrets.Items) != 1 {
		t.Fatalf("%d secrets, want 1", len(secrets.Items))
	}
	s := secrets.Items[0]
	if s.Name != "bootstrap-token-"+id.BootstrapToken[:6] || s.StringData["expiration"] != "2026-11-30T12:10:00Z" || s.StringData["auth-extra-groups"] != BootstrapGroup {
		t.Errorf("token secret = %s %+v", s.Name, s.StringData)
	}
	id2, _ := m.Identity(context.Background(), req, net.ParseIP("10.250.3.3"), "")
	if id2.BootstrapToken == id.BootstrapToken {
		t.Error("two nodes got the same token")
	}
}

func TestIdentityCarriesTheNodesCertificates(t *testing.T) {
	plan, _ := nodenet.ForIndex(3)
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	p, err := pki.Ensure(t.TempDir(), pki.Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	signer, err := pki.LoadNodeSigner(p)
	if err != nil {
		t.Fatal(err)
	}
	m := Minter{Tenant: fake.NewSimpleClientset(), APIServer: "https://10.250.3.1:7500", CACert: []byte("PEM"), ClientCA: []byte("CLIENT PEM"),
		Plan: plan, Registry: "http://10.250.3.1:5000", Now: func() time.Time { return now }}
	req := nodes.NodeRequest{Cluster: "ci", Name: "ci-abc", CPUs: 1, MemoryMiB: 1024, MaxPods: 110}
	id, err := m.Identity(context.Background(), req, net.ParseIP("10.250.3.2"), "")
	if err != nil {
		t.Fatal(err)
	}
	if id.KubeletClientCert != "" || id.KubeletClientKey != "" || id.KubeletServingCert != "" || id.KubeletServingKey != "" {
		t.Error("a minter without a signer issued a certificate")
	}
	m.NodeSigner = signer
	id, err = m.Identity(context.Background(), req, net.ParseIP("10.250.3.2"), "")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair([]byte(id.KubeletClientCert), []byte(id.KubeletClientKey))
	if err != nil {
		t.Fatalf("the identity's client certificate and key: %v", err)
	}
	cert, _ := x509.ParseCertificate(pair.Certificate[0])
	if cert.Subject.CommonName != "system:node:ci-abc" {
		t.Errorf("client certificate for %q, want system:node:ci-abc", cert.Subject.CommonName)
	}
	if id.BootstrapToken == "" {
		t.Error("no bootstrap token beside the certificate (the kubelet rotates through a CSR)")
	}
	// The serving certificate: what the tenant apiserver accepts (its
	// --kubelet-certificate-authority is the server CA) when it dials the node.
	pair, err = tls.X509KeyPair([]byte(id.KubeletServingCert), []byte(id.KubeletServingKey))
	if err != nil {
		t.Fatalf("the identity's serving certificate and key: %v", err)
	}
	serving, _ := x509.ParseCertificate(pair.Certificate[0])
	caPEM, err := os.ReadFile(p.ServerCA)
	if err != nil {
		t.Fatal(err)
	}
	serverCA := x509.NewCertPool()
	serverCA.AppendCertsFromPEM(caPEM)
	for _, tc := range []struct {
		host   string
		verify bool
	}{
		{"10.250.3.2", true}, // the node's address, its InternalIP
		{"ci-abc", true},
		{"10.250.3.3", false},
		{"ci-other", false},
	} {
		_, err := serving.Verify(x509.VerifyOptions{Roots: serverCA, DNSName: tc.host, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if (err == nil) != tc.verify {
			t.Errorf("serving certificate verified for %s under the server CA: %v, want %v (err %v)", tc.host, err == nil, tc.verify, err)
		}
	}
}
