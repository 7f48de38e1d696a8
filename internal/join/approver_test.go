package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// csrFor makes a CSR as user (in groups) for subject, with extra SANs if dns.
func csrFor(t *testing.T, user string, groups []string, cn string, org []string, dns []string, usages ...certificatesv1.KeyUsage) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: cn, Organization: org}, DNSNames: dns,
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	if usages == nil {
		usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	}
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "node-csr-x"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Usages:     usages, Username: user, Groups: groups,
		},
	}
}

func TestDecide(t *testing.T) {
	nodeGroup := []string{"system:nodes"}
	boot := []string{"system:bootstrappers", BootstrapGroup}
	tokens := map[string]string{"aaaaaa": "ci-1", "bbbbbb": "ci-2", "cccccc": ""}
	tokenNode := func(_ context.Context, id string) (string, error) {
		if id == "broken" {
			return "", errors.New("apiserver unavailable")
		}
		n, ok := tokens[id]
		if !ok {
			return "", apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, "bootstrap-token-"+id)
		}
		return n, nil
	}
	serving := csrFor(t, "system:bootstrap:aaaaaa", boot, "system:node:ci-1", nodeGroup, nil)
	serving.Spec.SignerName = certificatesv1.KubeletServingSignerName
	approved := csrFor(t, "system:bootstrap:aaaaaa", boot, "system:node:ci-1", nodeGroup, nil)
	approved.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved}}
	for _, tc := range []struct {
		name       string
		csr        *certificatesv1.CertificateSigningRequest
		want       Verdict
		wantReason string
		wantErr    bool
	}{
		{"a token's CSR for its own node", csrFor(t, "system:bootstrap:aaaaaa", boot, "system:node:ci-1", nodeGroup, nil), Approve, "minted for node ci-1", false},
		{"a token's CSR for another node", csrFor(t, "system:bootstrap:aaaaaa", boot, "system:node:ci-2", nodeGroup, nil), Deny, `minted for node "ci-1", not "ci-2"`, false},
		{"a token's CSR for the admin", csrFor(t, "system:bootstrap:aaaaaa", boot, "kubernetes-admin", []string{"system:masters"}, nil), Deny, "not system:node:NAME", false},
		{"a token's CSR with extra groups", csrFor(t, "system:bootstrap:aaaaaa", boot, "system:node:ci-1", []string{"system:nodes", "system:masters"}, nil), Deny, "not [system:nodes]", false},
		{"a token's CSR with SANs", csrFor(t, "system:bootstrap:aaaaaa", boot, "system:node:ci-1", nodeGroup, []string{"kubernetes.default"}), Deny, "subject alternative names", false},
		{"a token's CSR for server auth", csrFor(t, "system:bootstrap:aaaaaa", boot, "system:node:ci-1", nodeGroup, nil, certificatesv1.UsageServerAuth), Deny, "not one of a kubelet client", false},
		{"a deleted token", csrFor(t, "system:bootstrap:zzzzzz", boot, "system:node:ci-1", nodeGroup, nil), Deny, "no longer exists", false},
		{"a token not minted for a node", csrFor(t, "system:bootstrap:cccccc", boot, "system:node:ci-1", nodeGroup, nil), Deny, "not minted by socialweb", false},
		{"the token cannot be read", csrFor(t, "system:bootstrap:broken", boot, "system:node:ci-1", nodeGroup, nil), Ignore, "", true},
		{"a node renews its own", csrFor(t, "system:node:ci-2", nodeGroup, "system:node:ci-2", nodeGroup, nil), Approve, "renews its own", false},
		{"a node asks for another node", csrFor(t, "system:node:ci-2", nodeGroup, "system:node:ci-1", nodeGroup, nil), Ignore, "", false},
		{"a user's request is left to the admin", csrFor(t, "alice", nil, "system:node:ci-1", nodeGroup, nil), Ignore, "", false},
		{"another signer", serving, Ignore, "", false},
		{"already approved", approved, Ignore, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, reason, err := Decide(context.Background(), tc.csr, tokenNode)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if v != tc.want || !strings.Contains(reason, tc.wantReason) {
				t.Errorf("Decide = %v %q, want %v saying %q", v, reason, tc.want, tc.wantReason)
			}
		})
	}
}

func TestDeleteTokens(t *testing.T) {
	ctx := context.Background()
	secret := func(name, node string, typ corev1.SecretType) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceSystem, Labels: map[string]string{NodeLabel: node}}, Type: typ}
	}
	kube := fake.NewSimpleClientset(
		secret("bootstrap-token-aaaaaa", "ci-1", corev1.SecretTypeBootstrapToken),
		secret("bootstrap-token-bbbbbb", "ci-2", corev1.SecretTypeBootstrapToken),
		secret("not-a-token", "ci-1", corev1.SecretTypeOpaque),
	)
	if err := DeleteTokens(ctx, kube, "ci-1"); err != nil {
		t.Fatal(err)
	}
	list, _ := kube.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
	var left []string
	for _, s := range list.Items {
		left = append(left, s.Name)
	}
	if strings.Join(left, ",") != "bootstrap-token-bbbbbb,not-a-token" {
		t.Errorf("secrets left %v, want ci-2's token and the Opaque secret", left)
	}
}

// The minted token and the approver agree on the label that names the node.
func TestMintedTokenNamesItsNode(t *testing.T) {
	ctx := context.Background()
	plan, _ := nodenet.ForIndex(3)
	kube := fake.NewSimpleClientset()
	m := Minter{Tenant: kube, APIServer: "https://10.250.3.1:7500", CACert: []byte("PEM"), ClientCA: []byte("CLIENT PEM"), Plan: plan, Registry: "http://10.250.3.1:5000"}
	id, err := m.Identity(ctx, nodes.NodeRequest{Cluster: "ci", Name: "ci-7", CPUs: 1, MemoryMiB: 1024, MaxPods: 110}, net.ParseIP("10.250.3.7"), "02:00:00:00:00:07")
	if err != nil {
		t.Fatal(err)
	}
	tokenID, _, _ := strings.Cut(id.BootstrapToken, ".")
	s, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, "bootstrap-token-"+tokenID, metav1.GetOptions{})
	if err != nil || s.Labels[NodeLabel] != "ci-7" {
		t.Fatalf("token %s: %v, labels %v; want it labelled for ci-7", tokenID, err, s.Labels)
	}
	if err := DeleteTokens(ctx, kube, "ci-7"); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, s.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("token after DeleteTokens: %v, want not found", err)
	}
}
