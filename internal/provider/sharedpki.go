package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/pki"
)

// PKISecretName is the management-API Secret holding a tenant's CAs and
// service-account key when hosts share the management API (Config.SharePKI):
// whichever host runs the tenant next starts it with the same CAs, so its
// kubeconfigs, runner tokens and nodes' trust survive a move. The management
// API keeps Secrets encrypted in the datastore.
func PKISecretName(cluster string) string { return cluster + "-pki" }

// sharedPKIFiles are a tenant's PKI files that must be the same on every host
// (its leaves are issued again from them where it runs).
func sharedPKIFiles(p pki.Paths) map[string]string {
	return map[string]string{
		"server-ca.crt": p.ServerCA, "server-ca.key": p.ServerCAKey,
		"client-ca.crt": p.ClientCA, "client-ca.key": p.ClientCAKey,
		"sa.key": p.ServiceAccountKey, "sa.pub": p.ServiceAccountPub,
		"front-proxy-ca.crt": p.FrontProxyCA, "front-proxy-ca.key": p.FrontProxyCAKey,
	}
}

// restorePKI writes the tenant's shared CAs into its PKI dir before it is
// prepared on this host; a tenant with none stored yet (new) keeps what it has.
func (p *Provider) restorePKI(ctx context.Context, cluster string, paths pki.Paths) error {
	s, err := p.kube.CoreV1().Secrets(v1.SystemNamespace).Get(ctx, PKISecretName(cluster), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the CAs of %s: %w", cluster, err)
	}
	if err := os.MkdirAll(paths.Dir, 0o700); err != nil {
		return err
	}
	for name, path := range sharedPKIFiles(paths) {
		b, ok := s.Data[name]
		if !ok {
			return fmt.Errorf("the CAs of %s (Secret %s/%s) lack %s: delete that Secret on the host that last ran it to store them again", cluster, v1.SystemNamespace, s.Name, name)
		}
		if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, b) {
			continue
		}
		mode := os.FileMode(0o600)
		if strings.HasSuffix(name, ".crt") || strings.HasSuffix(name, ".pub") {
			mode = 0o644
		}
		if err := os.WriteFile(path, b, mode); err != nil {
			return fmt.Errorf("writing %s of %s: %w", name, cluster, err)
		}
	}
	return nil
}

// savePKI stores the tenant's CAs once they exist, if what is stored differs.
func (p *Provider) savePKI(ctx context.Context, cluster string, paths pki.Paths) error {
	data := map[string][]byte{}
	for name, path := range sharedPKIFiles(paths) {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("storing the CAs of %s: %s is missing", cluster, path)
		}
		if err != nil {
			return err
		}
		data[name] = b
	}
	cur, err := p.kube.CoreV1().Secrets(v1.SystemNamespace).Get(ctx, PKISecretName(cluster), metav1.GetOptions{})
	if err == nil && equalData(cur.Data, data) {
		return nil
	}
	return p.putSecret(ctx, cluster, PKISecretName(cluster), data)
}

func equalData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
