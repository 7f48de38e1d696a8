package gitlab

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Credential is a minted runner identity and where to use it.
type Credential struct {
	Grant
	Cluster string    // the tenant cluster's name, for names in the files
	Server  string    // the tenant apiserver's URL
	CA      []byte    // PEM of the CA that signed the apiserver's certificate
	Token   string    // the ServiceAccount token
	Expires time.Time // when the apiserver stops accepting Token
}

// Kubeconfig is a kubeconfig with the CA and token embedded and the runner's namespace
// as the default, so `kubectl --kubeconfig F auth can-i ...` answers for the runner.
func (c Credential) Kubeconfig() ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	ctx := c.Cluster + "-" + c.Name
	cfg.Clusters[c.Cluster] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthorityData: c.CA}
	cfg.AuthInfos[ctx] = &clientcmdapi.AuthInfo{Token: c.Token}
	cfg.Contexts[ctx] = &clientcmdapi.Context{Cluster: c.Cluster, AuthInfo: ctx, Namespace: c.Namespace}
	cfg.CurrentContext = ctx
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("writing the runner kubeconfig for %s: %w", c.Cluster, err)
	}
	return b, nil
}

// RunnerTemplate is a config.toml template for `gitlab-runner register --template-config`:
// the kubernetes executor's connection and namespace, without the GitLab URL and runner
// token, which `register` adds. caFile is where the CA PEM is written for the runner.
func (c Credential) RunnerTemplate(caFile string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# socialweb: kubernetes executor for cluster %s, namespace %s, as %s.\n", c.Cluster, c.Namespace, c.Username())
	fmt.Fprintf(&b, "# The token expires %s; mint another with `socialweb cluster runner-credential %s`.\n", c.Expires.UTC().Format(time.RFC3339), c.Cluster)
	b.WriteString("[[runners]]\n")
	b.WriteString("  executor = \"kubernetes\"\n")
	b.WriteString("  [runners.kubernetes]\n")
	for _, kv := range []struct{ key, value string }{
		{"host", c.Server},
		{"ca_file", caFile},
		{"bearer_token", c.Token},
		{"namespace", c.Namespace},
	} {
		v, err := tomlString(kv.value)
		if err != nil {
			return nil, fmt.Errorf("runner config %s: %w", kv.key, err)
		}
		fmt.Fprintf(&b, "    %s = %s\n", kv.key, v)
	}
	return []byte(b.String()), nil
}

// tomlString quotes s as a TOML basic string. Control characters have no place in a
// URL, path or token, so they are refused rather than escaped.
func tomlString(s string) (string, error) {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			return "", fmt.Errorf("%q contains a control character", s)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String(), nil
}
