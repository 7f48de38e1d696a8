package controlplane

import (
	"fmt"
	"strconv"

	"github.com/socialweb-computer/socialweb/internal/pki"
)

// serviceAccountIssuer is the same in every cluster; each cluster's tokens
// are still its own because each has its own signing key.
const serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

func apiserverArgs(c Config) []string {
	p := c.PKI()
	kcert, kkey := p.Cert(pki.KubeletClient)
	args := []string{
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.Port),
		"--advertise-address=" + c.AdvertiseAddress,
		"--etcd-servers=" + kineEndpoint,
		"--storage-backend=etcd3",
		"--tls-cert-file=" + p.ServingCert,
		"--tls-private-key-file=" + p.ServingKey,
		"--client-ca-file=" + p.ClientCA,
		"--service-account-key-file=" + p.ServiceAccountPub,
		"--service-account-signing-key-file=" + p.ServiceAccountKey,
		"--service-account-issuer=" + serviceAccountIssuer,
		"--api-audiences=" + serviceAccountIssuer,
		"--service-cluster-ip-range=" + c.ServiceCIDR,
		"--kubelet-client-certificate=" + kcert,
		"--kubelet-client-key=" + kkey,
		"--anonymous-auth=false",
		"--allow-privileged=true",
		"--profiling=false",
		"--cert-dir=" + p.Dir,
		"--event-ttl=1h",
		"--v=0",
	}
	if c.Tenant {
		fcert, fkey := p.Cert(pki.FrontProxyClient)
		args = append(args,
			"--authorization-mode=Node,RBAC",
			"--enable-bootstrap-token-auth=true",
			"--enable-admission-plugins=NodeRestriction",
			// Node names are unique per boot and resolve nowhere; the node's address
			// (set by the kubelet and the cloud controller) is how logs and exec reach it.
			"--kubelet-preferred-address-types=InternalIP,Hostname",
			// Each kubelet serves with a certificate from the server CA for its name and
			// address (the host issues it onto the node's identity disk), so logs, exec
			// and port-forward reach the node they name and no other.
			"--kubelet-certificate-authority="+p.ServerCA,
			// The apiserver runs on the host, where ClusterIPs route nowhere (they are
			// the nodes' doing) but Pod IPs do (podroutes): admission webhooks and
			// aggregated APIs are dialled at their Service's endpoints.
			"--enable-aggregator-routing=true",
			// Aggregation: the apiserver proxies to an aggregated API with the front-proxy
			// client certificate and names the user in these headers; the aggregated
			// server trusts them from that certificate alone (it reads this CA and these
			// names from kube-system/extension-apiserver-authentication).
			"--requestheader-client-ca-file="+p.FrontProxyCA,
			"--requestheader-allowed-names="+pki.FrontProxyClient.CommonName,
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--requestheader-group-headers=X-Remote-Group",
			"--requestheader-username-headers=X-Remote-User",
			"--proxy-client-cert-file="+fcert,
			"--proxy-client-key-file="+fkey,
		)
	} else {
		// The management API advertises loopback, which the endpoint
		// reconciler refuses; nothing in it needs the kubernetes Service.
		args = append(args, "--authorization-mode=RBAC", "--endpoint-reconciler-type=none")
	}
	if c.EncryptionConfig != "" {
		args = append(args, "--encryption-provider-config="+c.EncryptionConfig)
	}
	return args
}

func controllerManagerArgs(c Config) []string {
	p := c.PKI()
	kc := c.Kubeconfig(pki.ControllerManager)
	return []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		// No serving port: nothing scrapes it, and a port per tenant
		// would be one more thing to lease.
		"--secure-port=0",
		"--leader-elect=false",
		// bootstrapsigner and tokencleaner are off by default; nodes join
		// with bootstrap tokens, so they are needed. The upstream CSR approver
		// approves a token's node-client CSR for any node name; join's
		// approver, run beside this (Run), approves only the minted one.
		"--controllers=*,bootstrapsigner,tokencleaner,-" + csrApprovingController,
		"--cluster-signing-cert-file=" + p.ClientCA,
		"--cluster-signing-key-file=" + p.ClientCAKey,
		"--root-ca-file=" + p.ServerCA,
		"--service-account-private-key-file=" + p.ServiceAccountKey,
		"--use-service-account-credentials=true",
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + c.ClusterCIDR,
		fmt.Sprintf("--node-cidr-mask-size=%d", c.NodeCIDRMaskSize),
		"--service-cluster-ip-range=" + c.ServiceCIDR,
		"--profiling=false",
		"--v=0",
	}
}

func schedulerArgs(c Config) []string {
	kc := c.Kubeconfig(pki.Scheduler)
	return []string{
		"--config=" + c.SchedulerConfig(), // kubeconfig, leader election, backoff
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--secure-port=0",
		"--profiling=false",
		"--v=0",
	}
}

// ComponentArgs returns the flags each component runs with, so a benchmark
// can start the upstream binaries with exactly the same configuration.
func ComponentArgs(c Config) (apiserver, controllerManager, scheduler []string) {
	return apiserverArgs(c), controllerManagerArgs(c), schedulerArgs(c)
}
