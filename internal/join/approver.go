package join

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// NodeLabel is the label on a minted bootstrap token naming the one node it was
// minted for.
const NodeLabel = "socialweb.computer/node"

// ApproverName is the name the approver signs its conditions with.
const ApproverName = "socialweb-node-approver"

// Verdict is what the approver does with one CSR.
type Verdict int

const (
	// Ignore leaves the CSR to someone else (the tenant's admin may approve it).
	Ignore Verdict = iota
	Approve
	Deny
)

// TokenNode returns the node a bootstrap token was minted for ("" if the token
// names none), or an error satisfying apierrors.IsNotFound if there is no token.
type TokenNode func(ctx context.Context, tokenID string) (string, error)

// Decide is the approval of one kubelet client CSR, a pure function of the CSR
// and the token it came with. It replaces kube-controller-manager's approver,
// which approves a node-client CSR from any bootstrap token for any node name:
// a privileged Pod that read its node's identity disk could then get a
// certificate for another node of its cluster. Here a token's CSR is approved
// only for the node the host minted it for, and a node may renew only its own.
func Decide(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, tokenNode TokenNode) (Verdict, string, error) {
	if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName || decided(csr) {
		return Ignore, "", nil
	}
	node, err := nodeClientName(csr)
	if err != nil {
		return Deny, err.Error(), nil
	}
	user := csr.Spec.Username
	switch {
	case user == "system:node:"+node && slices.Contains(csr.Spec.Groups, "system:nodes"):
		return Approve, "node " + node + " renews its own client certificate", nil
	case strings.HasPrefix(user, "system:bootstrap:"):
		id := strings.TrimPrefix(user, "system:bootstrap:")
		minted, err := tokenNode(ctx, id)
		switch {
		case apierrors.IsNotFound(err):
			return Deny, fmt.Sprintf("bootstrap token %s no longer exists (its node joined, or it expired)", id), nil
		case err != nil:
			return Ignore, "", fmt.Errorf("reading bootstrap token %s: %w", id, err)
		case minted == "":
			return Deny, fmt.Sprintf("bootstrap token %s was not minted by socialweb for a node", id), nil
		case minted != node:
			return Deny, fmt.Sprintf("bootstrap token %s was minted for node %q, not %q", id, minted, node), nil
		}
		return Approve, fmt.Sprintf("bootstrap token %s was minted for node %s", id, node), nil
	}
	return Ignore, "", nil
}

func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
			return true
		}
	}
	return false
}

// nodeClientName checks that csr asks for a kubelet client certificate and
// nothing more (the subject system:node:NAME in system:nodes, no SANs, client
// usages only) and returns NAME.
func nodeClientName(csr *certificatesv1.CertificateSigningRequest) (string, error) {
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return "", errors.New("the request is not a PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("the request does not parse: %w", err)
	}
	name, ok := strings.CutPrefix(req.Subject.CommonName, "system:node:")
	if !ok || name == "" {
		return "", fmt.Errorf("subject %q is not system:node:NAME", req.Subject.CommonName)
	}
	if !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) {
		return "", fmt.Errorf("organization %v is not [system:nodes]", req.Subject.Organization)
	}
	if len(req.DNSNames)+len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs) > 0 {
		return "", errors.New("a kubelet client certificate has no subject alternative names")
	}
	client := false
	for _, u := range csr.Spec.Usages {
		switch u {
		case certificatesv1.UsageClientAuth:
			client = true
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment:
		default:
			return "", fmt.Errorf("usage %q is not one of a kubelet client certificate", u)
		}
	}
	if !client {
		return "", errors.New("the usages lack client auth")
	}
	return name, nil
}

// RunApprover approves and denies the tenant's kubelet client CSRs (Decide),
// and deletes a node's bootstrap token once its Node registers: after the join
// nothing needs it, and a Pod on that node could read it from the identity
// disk. It returns when ctx ends.
func RunApprover(ctx context.Context, kube kubernetes.Interface, log *slog.Logger) error {
	factory := informers.NewSharedInformerFactory(kube, 10*time.Minute)
	csrs := factory.Certificates().V1().CertificateSigningRequests().Informer()
	tokenNode := func(ctx context.Context, id string) (string, error) {
		s, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, "bootstrap-token-"+id, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if s.Type != corev1.SecretTypeBootstrapToken {
			return "", nil
		}
		return s.Labels[NodeLabel], nil
	}
	judge := func(obj any) {
		csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
		if !ok {
			return
		}
		if err := judgeCSR(ctx, kube, csr, tokenNode, log); err != nil {
			log.Warn("node certificate request not judged", "csr", csr.Name, "err", err)
		}
	}
	if _, err := csrs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    judge,
		UpdateFunc: func(_, obj any) { judge(obj) },
	}); err != nil {
		return fmt.Errorf("watching CSRs: %w", err)
	}
	forget := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		if err := DeleteTokens(ctx, kube, n.Name); err != nil {
			log.Warn("bootstrap token of a registered node not deleted", "node", n.Name, "err", err)
		}
	}
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: forget}); err != nil {
		return fmt.Errorf("watching Nodes: %w", err)
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

func judgeCSR(ctx context.Context, kube kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest, tokenNode TokenNode, log *slog.Logger) error {
	v, reason, err := Decide(ctx, csr, tokenNode)
	if err != nil || v == Ignore {
		return err
	}
	cond := certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: "SocialwebNodeApproved", Message: reason, LastUpdateTime: metav1.Now(),
	}
	if v == Deny {
		cond.Type, cond.Reason = certificatesv1.CertificateDenied, "SocialwebNodeDenied"
	}
	c := csr.DeepCopy()
	c.Status.Conditions = append(c.Status.Conditions, cond)
	if _, err := kube.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, c.Name, c, metav1.UpdateOptions{FieldManager: ApproverName}); err != nil {
		return fmt.Errorf("recording %s: %w", cond.Type, err)
	}
	log.Info("node certificate request judged", "csr", c.Name, "verdict", cond.Type, "requester", c.Spec.Username, "reason", reason)
	return nil
}

// DeleteTokens deletes the bootstrap tokens minted for node.
func DeleteTokens(ctx context.Context, kube kubernetes.Interface, node string) error {
	list, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: NodeLabel + "=" + node})
	if err != nil {
		return fmt.Errorf("listing the bootstrap tokens of node %s: %w", node, err)
	}
	var errs []error
	for _, s := range list.Items {
		if s.Type != corev1.SecretTypeBootstrapToken || s.Labels[NodeLabel] != node {
			continue
		}
		if err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting %s: %w", s.Name, err))
		}
	}
	return errors.Join(errs...)
}
