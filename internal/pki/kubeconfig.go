package pki

import (
	"fmt"
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
)

// Kubeconfig builds a kubeconfig for server that embeds the server CA and a
// client identity's certificate and key, so it works copied anywhere.
func Kubeconfig(p Paths, id Identity, contextName, server string) ([]byte, error) {
	return KubeconfigVia(p, id, contextName, server, "")
}

// KubeconfigVia is Kubeconfig for a server reached by name: serverName (""
// for none) is sent as SNI and checked against the serving certificate
// (tls-server-name), whatever host the server URL names. The front door
// routes by it, and a sleeping tenant wakes only for it: Go sends no SNI for
// a URL whose host is an IP address.
func KubeconfigVia(p Paths, id Identity, contextName, server, serverName string) ([]byte, error) {
	ca, err := os.ReadFile(p.ServerCA)
	if err != nil {
		return nil, fmt.Errorf("reading server CA: %w", err)
	}
	certPath, keyPath := p.Cert(id)
	cert, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("reading %s certificate: %w", id.Name, err)
	}
	key, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("reading %s key: %w", id.Name, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[contextName] = &clientcmdapi.Cluster{Server: server, TLSServerName: serverName, CertificateAuthorityData: ca}
	cfg.AuthInfos[contextName] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts[contextName] = &clientcmdapi.Context{Cluster: contextName, AuthInfo: contextName}
	cfg.CurrentContext = contextName
	return clientcmd.Write(*cfg)
}

// WriteKubeconfig writes a kubeconfig with mode 0600: it holds a private key.
func WriteKubeconfig(path string, p Paths, id Identity, contextName, server string) error {
	return WriteKubeconfigVia(path, p, id, contextName, server, "")
}

// WriteKubeconfigVia is WriteKubeconfig with serverName, as KubeconfigVia.
func WriteKubeconfigVia(path string, p Paths, id Identity, contextName, server, serverName string) error {
	b, err := KubeconfigVia(p, id, contextName, server, serverName)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}
