package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestFrontDoor: one listener carries two tenants by SNI. A cluster made
// before the door was configured (named under the default domain) gets the
// door's domain on its serving certificate and in its kubeconfig when the
// daemon restarts with it; each
// kubeconfig reaches its own tenant through the door (list, watch, kubectl);
// one tenant's certificate is refused under another's name; an unknown name
// and no name at all get the same refusal; the door's metrics count per cluster.
func TestFrontDoor(t *testing.T) {
	const domain = "tenants.test"
	door := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	metrics := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	d := newDaemon(t, 2, "--metrics-address", metrics)
	d.start()
	d.mustCLI("cluster", "create", "alpha", "--wait")
	// Its name under the default domain, which wakes it on its own port if it sleeps.
	if cl := kubeconfigCluster(t, d, "alpha"); cl.TLSServerName != "alpha."+frontdoor.DefaultDomain || !strings.HasPrefix(cl.Server, "https://127.0.0.1:") {
		t.Fatalf("without a door alpha's kubeconfig names %s (server name %q), want its own loopback port as alpha.%s", cl.Server, cl.TLSServerName, frontdoor.DefaultDomain)
	}

	// The same state dir, now with the door (the flag's env twin works as well).
	d.stop(syscall.SIGTERM)
	d.extra = append(d.extra, "--front-door", door)
	t.Setenv("SOCIALWEB_FRONT_DOOR_DOMAIN", domain)
	d.start()
	d.waitPhase("alpha", v1.PhaseReady, 2*time.Minute)
	d.mustCLI("cluster", "create", "beta", "--wait")

	cfgs := map[string]*rest.Config{}
	for _, name := range []string{"alpha", "beta"} {
		sni := name + "." + domain
		cl := kubeconfigCluster(t, d, name)
		if cl.Server != "https://"+door || cl.TLSServerName != sni {
			t.Errorf("%s's kubeconfig names %s as %q, want https://%s as %q", name, cl.Server, cl.TLSServerName, door, sni)
		}
		cfg, k := d.tenant(name)
		cfgs[name] = cfg
		if _, err := k.CoreV1().Namespaces().List(ctxT(t, 30*time.Second), metav1.ListOptions{}); err != nil {
			t.Fatalf("listing %s's namespaces through the door: %v", name, err)
		}
		putConfigMap(t, k, "from-"+name)
		// The serving certificate carries the SNI name and chains to the tenant's CA.
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(cfg.TLSClientConfig.CAData)
		c, err := tls.Dial("tcp", door, &tls.Config{RootCAs: pool, ServerName: sni})
		if err != nil {
			t.Fatalf("TLS to %s through the door, checked against its CA: %v", sni, err)
		}
		if leaf := c.ConnectionState().PeerCertificates[0]; !slices.Contains(leaf.DNSNames, sni) {
			t.Errorf("%s's serving certificate names %v, want %s among them", name, leaf.DNSNames, sni)
		}
		c.Close()
		kubectlThroughDoor(t, d, name)
	}
	_, kA := d.tenant("alpha")
	_, kB := d.tenant("beta")
	if hasConfigMap(t, kA, "from-beta") || hasConfigMap(t, kB, "from-alpha") {
		t.Fatal("through the door one tenant sees the other's objects")
	}
	// Each tenant's own loopback port still works.
	direct := rest.CopyConfig(cfgs["alpha"])
	direct.Host, direct.TLSClientConfig.ServerName = d.cluster("alpha").Status.URL, ""
	if _, err := kubernetes.NewForConfigOrDie(direct).CoreV1().Namespaces().List(ctxT(t, 30*time.Second), metav1.ListOptions{}); err != nil {
		t.Errorf("alpha on its own port: %v", err)
	}

	// A watch through the door sees an object made after it started.
	ctx := ctxT(t, time.Minute)
	w, err := kA.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watching through the door: %v", err)
	}
	putConfigMap(t, kA, "watched")
	for seen := false; !seen; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch through the door ended")
			}
			if cm, isCM := ev.Object.(*corev1.ConfigMap); isCM && ev.Type == watch.Added && cm.Name == "watched" {
				seen = true
			}
		case <-ctx.Done():
			t.Fatal("the watch through the door did not see the new ConfigMap")
		}
	}
	w.Stop()

	// alpha's admin certificate under beta's name: beta's apiserver refuses it (401).
	cross := rest.CopyConfig(cfgs["beta"])
	cross.TLSClientConfig.CertData, cross.TLSClientConfig.KeyData = cfgs["alpha"].TLSClientConfig.CertData, cfgs["alpha"].TLSClientConfig.KeyData
	_, err = kubernetes.NewForConfigOrDie(cross).CoreV1().Namespaces().List(ctxT(t, 30*time.Second), metav1.ListOptions{})
	if !apierrors.IsUnauthorized(err) {
		t.Errorf("alpha's admin certificate sent as beta: %v, want 401 Unauthorized", err)
	}
	// alpha's whole kubeconfig (trusting alpha's CA) pointed at beta's name: beta's certificate is not trusted.
	wrong := rest.CopyConfig(cfgs["alpha"])
	wrong.TLSClientConfig.ServerName = "beta." + domain
	_, err = kubernetes.NewForConfigOrDie(wrong).CoreV1().Namespaces().List(ctxT(t, 30*time.Second), metav1.ListOptions{})
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("alpha's kubeconfig asking for beta: %v, want beta's certificate refused", err)
	}

	// An unknown name and no name: refused at the handshake, with the same bytes.
	unknown, errUnknown := doorAnswer(t, door, "nosuch."+domain)
	none, errNone := doorAnswer(t, door, "")
	for what, err := range map[string]error{"unknown name": errUnknown, "no name": errNone} {
		if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
			t.Errorf("%s: handshake %v, want the unrecognized_name alert", what, err)
		}
	}
	if !bytes.Equal(unknown, none) || len(unknown) == 0 {
		t.Errorf("the door answered an unknown name with %x and no name with %x, want the same alert", unknown, none)
	}

	// The runner credential names the door too, and works through it.
	runner := d.mustCLI("cluster", "runner-credential", "alpha")
	rc, err := clientcmd.RESTConfigFromKubeConfig([]byte(runner))
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://"+door || rc.TLSClientConfig.ServerName != "alpha."+domain {
		t.Errorf("runner kubeconfig names %s as %q, want the door as alpha.%s", rc.Host, rc.TLSClientConfig.ServerName, domain)
	}
	// Its Role has get on Pods, not list: NotFound is an answer from alpha that passed
	// authentication and authorization.
	if _, err := kubernetes.NewForConfigOrDie(rc).CoreV1().Pods("gitlab-runner").Get(ctxT(t, 30*time.Second), "no-such-job", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the runner credential through the door: %v, want NotFound", err)
	}

	// Metrics: connections and bytes per cluster; refusals by reason, never by name.
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatalf("scraping the daemon's metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`socialweb_frontdoor_connections_total{cluster="alpha"}`,
		`socialweb_frontdoor_connections_total{cluster="beta"}`,
		`socialweb_frontdoor_bytes_total{cluster="alpha",direction="in"}`,
		`socialweb_frontdoor_bytes_total{cluster="beta",direction="out"}`,
		`socialweb_frontdoor_refused_total{reason="unknown_name"}`,
		`socialweb_frontdoor_refused_total{reason="no_name"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(string(body), "socialweb_frontdoor"))
		}
	}
	if strings.Contains(string(body), "nosuch") {
		t.Errorf("a requested name is in the metrics:\n%s", grepLines(string(body), "nosuch"))
	}
}

// kubeconfigCluster is the cluster entry of a tenant's admin kubeconfig.
func kubeconfigCluster(t *testing.T, d *daemon, name string) struct{ Server, TLSServerName string } {
	t.Helper()
	cfg, err := clientcmd.Load([]byte(d.mustCLI("cluster", "kubeconfig", name)))
	if err != nil {
		t.Fatalf("parsing the kubeconfig of %s: %v", name, err)
	}
	cl := cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster]
	return struct{ Server, TLSServerName string }{cl.Server, cl.TLSServerName}
}

// doorAnswer makes a TLS handshake through the door asking for serverName
// ("" sends no SNI) and returns every byte the door sent back, and the
// handshake's error.
func doorAnswer(t *testing.T, door, serverName string) ([]byte, error) {
	t.Helper()
	raw, err := net.DialTimeout("tcp", door, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	rec := &recordingConn{Conn: raw}
	c := tls.Client(rec, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""})
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	err = c.Handshake()
	_, _ = io.Copy(io.Discard, rec) // the rest of the answer, up to the door's close
	return rec.buf.Bytes(), err
}

type recordingConn struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recordingConn) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// kubectlThroughDoor runs `kubectl get ns` with the tenant's kubeconfig when
// a kubectl is at hand (bin/kubectl, which hack/demo builds, or on PATH).
func kubectlThroughDoor(t *testing.T, d *daemon, name string) {
	t.Helper()
	kubectl, err := filepath.Abs("../../bin/kubectl")
	if _, serr := os.Stat(kubectl); err != nil || serr != nil {
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			t.Logf("no kubectl (bin/kubectl or on PATH): `kubectl get ns` through the door not run")
			return
		}
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := os.WriteFile(path, []byte(d.mustCLI("cluster", "kubeconfig", name)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl, "--kubeconfig", path, "get", "ns", "kube-system", "-o", "name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "namespace/kube-system" {
		t.Errorf("kubectl get ns through the door for %s: %v\n%s", name, err, out)
	}
}

// throughTheDoor runs, against a running busybox Pod, what a kubeconfig that
// names the front door must carry besides logs and websocket exec (which the
// caller's steps did through it): exec over SPDY with stdin ending
// (a half-close through the door), and a port-forward over SPDY.
func throughTheDoor(t *testing.T, ctx context.Context, cfg *rest.Config, k kubernetes.Interface, ns, pod string) {
	t.Helper()
	if cfg.TLSClientConfig.ServerName == "" {
		t.Fatalf("the tenant kubeconfig names %s without a server name: not the front door", cfg.Host)
	}
	req := k.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: []string{"cat"}, Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: strings.NewReader("through-the-door\n"), Stdout: &stdout, Stderr: &stderr})
	if err != nil || stdout.String() != "through-the-door\n" {
		t.Errorf("exec over SPDY through the door: %q, %v (stderr %q)", stdout.String(), err, stderr.String())
	}

	if out, err := execIn(ctx, cfg, k, ns, pod, "sh", "-c", "mkdir -p /door && echo forwarded > /door/index.html && httpd -p 8080 -h /door && echo started"); err != nil || !strings.Contains(out, "started") {
		t.Fatalf("starting httpd in %s: %q, %v", pod, out, err)
	}
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u := k.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	stop, ready := make(chan struct{}), make(chan struct{})
	defer close(stop)
	fw, err := portforward.NewOnAddresses(spdy.NewDialer(upgrader, &http.Client{Transport: transport}, "POST", u),
		[]string{"127.0.0.1"}, []string{"0:8080"}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatalf("port-forward through the door: %v", err)
	case <-ctx.Done():
		t.Fatal("port-forward through the door not ready")
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("port-forward ports %v, %v", ports, err)
	}
	var body []byte
	livetest.Eventually(t, 30*time.Second, time.Second, "an answer through the port-forward", func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", ports[0].Local))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		return strings.TrimSpace(string(body)) == "forwarded"
	})
}
