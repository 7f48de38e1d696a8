package agent

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	proxyapp "k8s.io/kubernetes/cmd/kube-proxy/app"

	"github.com/socialweb-computer/socialweb/internal/clusterdns"
	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/nodehealth"
)

// ProxyConfig is the kube-proxy configuration file (KubeProxyConfiguration YAML):
// nftables mode, the kubelet's kubeconfig (the node's own identity; the control plane
// binds system:node-proxier to system:nodes), the node's name, and the cluster's pod
// range so Service traffic from outside it is masqueraded. Metrics and health listen on
// loopback.
//
// nftables, not iptables: iptables mode made its first sync with 47 iptables runs (a
// chain, a check and an insert for each of its jump rules, then its canaries), 3.8 s of
// a TCG vCPU while the node's first Pod started. nftables mode writes its rules in one
// nft transaction and lists them over netlink.
func ProxyConfig(id identity.Identity, l Layout) []byte {
	cidr := ""
	if id.PodCIDR != "" {
		cidr = fmt.Sprintf("clusterCIDR: %q\n", id.PodCIDR)
	}
	return fmt.Appendf(nil, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
hostnameOverride: %q
mode: nftables
%smetricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack:
  maxPerCore: 0
`, l.Kubeconfig, id.NodeName, cidr)
}

// stepProxy starts kube-proxy once the kubelet has finished its TLS bootstrap (kube-proxy
// uses the kubeconfig that writes) and the Node has its address. It does not wait for
// that: the boot chain goes on.
//
// kube-proxy runs as a child process (this binary, ProxyCommand), not in PID 1: it calls
// os.Exit to restart itself when the Node's addresses change, which in PID 1 panics the
// kernel. The child is started again whenever it exits.
func stepProxy(ctx context.Context, a *Agent) error {
	if a.Identity.NodeName == "" {
		return errors.New("the identity step must run before proxy")
	}
	cfgFile := a.Layout.ProxyConfig
	if err := os.MkdirAll(filepath.Dir(cfgFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(cfgFile, ProxyConfig(a.Identity, a.Layout), 0o644); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary to run kube-proxy: %w", err)
	}
	go func() {
		a.waitKubeletCredentials()
		a.waitNodeAddress()
		argv := proxyArgv(self, cfgFile)
		for restarts := 0; ; restarts++ {
			var err error
			if p := a.takeProxyPrestart(); p != nil {
				err = p.run()
			} else {
				err = a.runChild("kube-proxy", argv[0], argv[1:]...)
			}
			a.mu.Lock()
			stopping := a.stopping
			a.mu.Unlock()
			if stopping {
				return
			}
			a.Log.Error("kube-proxy exited; starting it again in 1s", "err", err, "restarts", restarts)
			time.Sleep(time.Second)
		}
	}()
	return nil
}

// proxyArgv is the command line of kube-proxy: this binary (self) as ProxyCommand. It
// runs at the agent's priority from its start: in nftables mode its first sync is a few
// nft runs, and at nice 10 (until 2026-12-03) that sync came seconds after the node's
// first Pod was running, so the Pod could not yet reach a ClusterIP.
func proxyArgv(self, cfgFile string) []string {
	return []string{self, ProxyCommand, "--config", cfgFile}
}

// ProxyCommand is the first argument that makes this binary run kube-proxy.
const ProxyCommand = "kube-proxy"

// ProxyMain runs kube-proxy with args (--config FILE) until SIGTERM; it is the child
// stepProxy starts. It returns the process's exit code.
func ProxyMain(args []string) int {
	fs := flag.NewFlagSet(ProxyCommand, flag.ContinueOnError)
	cfgFile := fs.String("config", "", "KubeProxyConfiguration file")
	waitStart := fs.Bool(proxyWaitStart, false, "read a line from stdin before reading the configuration and starting (the agent starts this process ahead: see stepProxyPrestart)")
	if err := fs.Parse(args); err != nil || *cfgFile == "" {
		fmt.Fprintln(os.Stderr, "usage: socialweb-node kube-proxy --config FILE [--"+proxyWaitStart+"]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	path, err := nftOnlyPath(proxyBinDir, exec.LookPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-proxy:", err)
		return 1
	}
	os.Setenv("PATH", path)
	if *waitStart {
		if err := waitForStart(os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, "kube-proxy: not started:", err)
			return 0
		}
	}
	if err := runProxy(ctx, *cfgFile); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "kube-proxy:", err)
		return 1
	}
	return 0
}

// proxyBinDir is kube-proxy's whole PATH (nftOnlyPath).
const proxyBinDir = "/run/socialweb/kube-proxy-bin"

// nftOnlyPath makes dir hold a link to the node's nft, and nothing else, and returns
// the PATH for kube-proxy. In nftables mode kube-proxy starts by removing what iptables
// and ipvs modes may have left: 34 iptables and ip6tables runs and a modprobe of ip_vs,
// each its own process, on a node whose kernel booted with no rules at all. With no
// iptables or modprobe on its PATH that clean-up finds nothing to run and is skipped.
func nftOnlyPath(dir string, lookPath func(string) (string, error)) (string, error) {
	nft, err := lookPath("nft")
	if err != nil {
		return "", fmt.Errorf("kube-proxy runs in nftables mode and needs nft (the node image's nftables package): %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("kube-proxy's PATH: %w", err)
	}
	link := filepath.Join(dir, "nft")
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("kube-proxy's PATH: %w", err)
	}
	if err := os.Symlink(nft, link); err != nil {
		return "", fmt.Errorf("kube-proxy's PATH: %w", err)
	}
	return dir, nil
}

// runChild runs self with args, its output on the console prefixed with name, until it
// exits.
func (a *Agent) runChild(name, self string, args ...string) error {
	cmd, err := startChild(name, nil, self, args...)
	if err != nil {
		return err
	}
	return cmd.Wait()
}

// startChild starts self with args, its output on the console prefixed with name and its
// stdin from stdin (nil: none).
func startChild(name string, stdin *os.File, self string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(self, args...)
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	if stdin != nil {
		cmd.Stdin = stdin
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, err
	}
	go prefixLines(r, os.Stdout, name+": ")
	return cmd, nil
}

// kube-proxy started ahead. Each exec of this binary first runs the Go initialization of
// every package in it (the kubelet, kube-proxy, containerd's client: 0.1 s on a host,
// 1-2 s of a TCG vCPU), and kube-proxy used to pay it in the seconds a node's first Pod
// starts. So a node's init starts kube-proxy's process before the identity step (a
// warm-pool VM: while it waits for its claim) with --wait-start; it initializes and waits
// on its stdin, and stepProxy releases it once its configuration is written and the
// Node has its address. If it has died by then, stepProxy starts one as before.

// proxyWaitStart is ProxyMain's flag to wait for the agent's go-ahead on stdin.
const proxyWaitStart = "wait-start"

// proxyPrestart is the kube-proxy process started ahead, waiting on its stdin.
type proxyPrestart struct {
	cmd     *exec.Cmd
	release *os.File // the write end of its stdin
}

// stepProxyPrestart starts kube-proxy's process ahead (only as a node's init: elsewhere
// this executable is not the agent's). A failure costs only the head start.
func stepProxyPrestart(ctx context.Context, a *Agent) error {
	if os.Getpid() != 1 {
		return nil
	}
	self, err := os.Executable()
	if err == nil {
		var p *proxyPrestart
		if p, err = startProxyPrestart(self, a.Layout.ProxyConfig); err == nil {
			a.mu.Lock()
			a.proxyPrestart = p
			a.mu.Unlock()
			return nil
		}
	}
	a.Log.Warn("kube-proxy: not started ahead; it starts when the node needs it", "err", err)
	return nil
}

// startProxyPrestart starts self as kube-proxy with --wait-start.
func startProxyPrestart(self, cfgFile string) (*proxyPrestart, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	argv := append(proxyArgv(self, cfgFile), "--"+proxyWaitStart)
	cmd, err := startChild("kube-proxy", r, argv[0], argv[1:]...)
	r.Close()
	if err != nil {
		w.Close()
		return nil, err
	}
	return &proxyPrestart{cmd: cmd, release: w}, nil
}

// takeProxyPrestart hands out the process started ahead once; nil after that.
func (a *Agent) takeProxyPrestart() *proxyPrestart {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.proxyPrestart
	a.proxyPrestart = nil
	return p
}

// run releases the process and waits for it to exit.
func (p *proxyPrestart) run() error {
	_, err := p.release.Write([]byte("start\n"))
	p.release.Close()
	if err != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		return fmt.Errorf("releasing the kube-proxy started ahead: %w", err)
	}
	return p.cmd.Wait()
}

// waitForStart returns once r gives a line; an end before one is an error.
func waitForStart(r io.Reader) error {
	_, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		return fmt.Errorf("waiting for the agent's go-ahead on stdin: %w", err)
	}
	return nil
}

// waitNodeAddress returns once the Node has an InternalIP (the cloud controller sets it
// after registration); kube-proxy started before that restarts itself when it appears.
// It gives up after two minutes: kube-proxy copes, at the cost of one restart.
func (a *Agent) waitNodeAddress() {
	client, err := a.kubeletClient()
	if err != nil {
		a.Log.Warn("kube-proxy: not waiting for the node's address", "err", err)
		return
	}
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := client.CoreV1().Nodes().Get(ctx, a.Identity.NodeName, metav1.GetOptions{})
		cancel()
		if err == nil && slices.ContainsFunc(n.Status.Addresses, func(ad corev1.NodeAddress) bool { return ad.Type == corev1.NodeInternalIP }) {
			return
		}
	}
	a.Log.Warn("kube-proxy: the node has no InternalIP after 2m; starting it anyway")
}

// kubeletClient is a tenant client with the kubelet's credentials (after
// waitKubeletCredentials).
func (a *Agent) kubeletClient() (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", a.Layout.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubelet kubeconfig %s: %w", a.Layout.Kubeconfig, err)
	}
	return kubernetes.NewForConfig(cfg)
}

// waitKubeletCredentials returns once the kubelet's TLS bootstrap has written its
// kubeconfig and the client certificate it names (the kubeconfig comes first).
func (a *Agent) waitKubeletCredentials() {
	clientCert := KubeletClientCurrent(a.Layout)
	for {
		_, err1 := os.Stat(a.Layout.Kubeconfig)
		_, err2 := os.Stat(clientCert)
		if err1 == nil && err2 == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stepDNS starts the node's cluster DNS server on the kubelet's clusterDNS address (the
// node's own address), answering cluster.local from the tenant API with the kubelet's
// credentials and forwarding other names to the gateway's resolver. The server restarts
// its listener if serving fails (clusterdns.Run), and is started again here if it ends.
func stepDNS(ctx context.Context, a *Agent) error {
	id := a.Identity
	if id.ClusterDNS == "" {
		a.Log.Info("no clusterDNS on the identity disk: no cluster DNS on this node")
		return nil
	}
	go func() {
		a.waitKubeletCredentials()
		log := a.Log.With("component", "dns")
		for {
			client, err := a.kubeletClient()
			if err == nil {
				err = clusterdns.Run(context.Background(), client, clusterDomain,
					net.JoinHostPort(id.ClusterDNS, "53"), net.JoinHostPort(id.DNS, "53"), log)
			}
			log.Error("cluster DNS ended; starting it again in 1s", "err", err)
			time.Sleep(time.Second)
		}
	}()
	return nil
}

// clusterDomain is the kubelet's clusterDomain and the zone the node's DNS answers.
const clusterDomain = "cluster.local"

// stepHealth keeps the node's network health on its Node object: whether it reaches the
// gateway (the tenant apiserver's address there) and whether its cluster DNS answers
// for the kubernetes Service (nodehealth conditions, True = problem).
func stepHealth(ctx context.Context, a *Agent) error {
	id := a.Identity
	u, err := url.Parse(id.APIServer)
	if err != nil || u.Host == "" {
		return fmt.Errorf("apiServer %q on the identity disk is not a URL: %v", id.APIServer, err)
	}
	p := nodehealth.Prober{Gateway: u.Host, ClusterDNS: net.JoinHostPort(id.ClusterDNS, "53"),
		Name: "kubernetes.default.svc." + clusterDomain}
	go func() {
		a.waitKubeletCredentials()
		client, err := a.kubeletClient()
		if err != nil {
			a.Log.Error("node health: no client; node conditions are not reported", "err", err)
			return
		}
		nodehealth.Run(context.Background(), client, id.NodeName, p, 10*time.Second, time.Minute, a.Log.With("component", "health"))
	}()
	return nil
}

// runProxy runs kube-proxy as its command does, without cobra.
func runProxy(ctx context.Context, configFile string) error {
	opts, err := proxyOptions(configFile)
	if err != nil {
		return err
	}
	return opts.Run(ctx)
}

// proxyOptions are kube-proxy's options from its flags and configFile, completed and
// validated by kube-proxy's own code.
func proxyOptions(configFile string) (*proxyapp.Options, error) {
	opts := proxyapp.NewOptions()
	fs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if err := fs.Parse([]string{"--config=" + configFile}); err != nil {
		return nil, fmt.Errorf("kube-proxy flags: %w", err)
	}
	if err := opts.Complete(fs); err != nil {
		return nil, fmt.Errorf("kube-proxy options: %w", err)
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("kube-proxy options: %w", err)
	}
	return opts, nil
}
