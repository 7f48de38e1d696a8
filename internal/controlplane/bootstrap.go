package controlplane

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/socialweb-computer/socialweb/internal/pki"
)

// nodeJoinBindings let a node join with a bootstrap token the way kubeadm
// nodes do: the token's group may create CSRs, its node-client CSRs are
// approved automatically, and nodes may renew their own certificates.
func nodeJoinBindings() []struct{ name, role, group string } {
	return []struct{ name, role, group string }{
		{"socialweb:kubelet-bootstrap", "system:node-bootstrapper", "system:bootstrappers"},
		{"socialweb:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", "system:bootstrappers"},
		{"socialweb:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes"},
		// kube-proxy runs inside each node's agent with the kubelet's credentials.
		{"socialweb:node-proxier", "system:node-proxier", "system:nodes"},
	}
}

// bootstrapTenant creates what nodes need to join: the RBAC bindings above
// and kube-public/cluster-info, which the bootstrap signer signs with each
// token so a joining node can check it talks to the right apiserver.
func bootstrapTenant(ctx context.Context, c Config) error {
	restCfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig(pki.Admin))
	if err != nil {
		return err
	}
	// A few dozen requests in a burst, not client-go's 5 per second.
	restCfg.QPS, restCfg.Burst = 100, 100
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	// cluster-info goes into kube-public, which upstream makes a moment after Ready.
	if err := upstreamObjects(ctx, kube, c); err != nil {
		return err
	}
	for _, b := range nodeJoinBindings() {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: b.group}},
		}
		if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating ClusterRoleBinding %s: %w", b.name, err)
		}
	}
	// The serviceaccount controller makes this too, a moment after it starts;
	// making it here means a Pod can be created as soon as the cluster is Ready.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: metav1.NamespaceDefault}}
	if _, err := kube.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the default ServiceAccount: %w", err)
	}
	ca, err := os.ReadFile(c.PKI().ServerCA)
	if err != nil {
		return err
	}
	info := clientcmdapi.NewConfig()
	info.Clusters[""] = &clientcmdapi.Cluster{
		Server:                   fmt.Sprintf("https://%s:%d", c.AdvertiseAddress, c.Port),
		CertificateAuthorityData: ca,
	}
	kc, err := clientcmd.Write(*info)
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "cluster-info", Namespace: metav1.NamespacePublic},
		Data:       map[string]string{"kubeconfig": string(kc)},
	}
	cms := kube.CoreV1().ConfigMaps(metav1.NamespacePublic)
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, gerr := cms.Get(ctx, cm.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		if cur.Data["kubeconfig"] != cm.Data["kubeconfig"] {
			cur.Data["kubeconfig"] = cm.Data["kubeconfig"]
			_, err = cms.Update(ctx, cur, metav1.UpdateOptions{})
		} else {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("publishing cluster-info: %w", err)
	}
	// cluster-info is read anonymously by kubeadm-style joins; ours present
	// a bootstrap token, so no anonymous Role is created.
	return nil
}
