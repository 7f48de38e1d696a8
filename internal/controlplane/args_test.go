package controlplane

import (
	"slices"
	"strings"
	"testing"

	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

func TestAPIServerArgs(t *testing.T) {
	// The aggregation flags a tenant's apiserver needs to proxy to an aggregated API
	// (Config.Dir is /d below, so its PKI is /d/pki).
	aggregation := []string{
		"--requestheader-client-ca-file=/d/pki/front-proxy-ca.crt",
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--proxy-client-cert-file=/d/pki/front-proxy-client.crt",
		"--proxy-client-key-file=/d/pki/front-proxy-client.key",
	}
	for _, tc := range []struct {
		name    string
		tenant  bool
		want    []string
		wantNot []string
		// noPrefix: no flag starts with any of these.
		noPrefix []string
		// kubeletCA is the CA the apiserver verifies kubelets with, as its own flag
		// parsing reads the arguments.
		kubeletCA string
	}{
		{"tenant", true,
			append([]string{"--authorization-mode=Node,RBAC", "--enable-bootstrap-token-auth=true", "--enable-aggregator-routing=true", "--anonymous-auth=false",
				// The kubelets' serving certificates are from the server CA.
				"--kubelet-certificate-authority=/d/pki/server-ca.crt"}, aggregation...),
			[]string{"--endpoint-reconciler-type=none"}, nil, "/d/pki/server-ca.crt"},
		// The management apiserver has no nodes.
		{"management", false,
			[]string{"--authorization-mode=RBAC", "--endpoint-reconciler-type=none", "--anonymous-auth=false"},
			append([]string{"--enable-aggregator-routing=true", "--enable-bootstrap-token-auth=true"}, aggregation...),
			[]string{"--requestheader-", "--proxy-client-", "--kubelet-certificate-authority"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := apiserverArgs(Config{Dir: "/d", Port: 6443, ServiceCIDR: "10.96.0.0/16", AdvertiseAddress: "10.0.0.1", Tenant: tc.tenant})
			for _, w := range tc.want {
				if !slices.Contains(args, w) {
					t.Errorf("missing %s in %v", w, args)
				}
			}
			for _, w := range tc.wantNot {
				if slices.Contains(args, w) {
					t.Errorf("unexpected %s in %v", w, args)
				}
			}
			for _, a := range args {
				for _, p := range tc.noPrefix {
					if strings.HasPrefix(a, p) {
						t.Errorf("unexpected %s (a %s flag)", a, p)
					}
				}
			}
			s := apiserveroptions.NewServerRunOptions()
			if err := parse("kube-apiserver", s.Flags(), args); err != nil {
				t.Fatal(err)
			}
			if got := s.KubeletConfig.TLSClientConfig.CAFile; got != tc.kubeletCA {
				t.Errorf("the apiserver verifies kubelets with %q, want %q", got, tc.kubeletCA)
			}
		})
	}
}
