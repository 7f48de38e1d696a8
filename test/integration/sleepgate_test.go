package integration

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/sleep"
)

// TestWakeGateWithAControlPlane runs the wake path without a daemon: a tenant
// control plane started on a socket the gate holds (--listen-fd); the activity
// mark moved by an admin's list and not by the daemon's user; the process
// stopped and the port gated; a bare connection and the daemon's list (its
// kubeconfig names no server) do not wake it; a list with the admin's
// kubeconfig (which names the cluster) is answered by a control plane the
// gate started for it.
func TestWakeGateWithAControlPlane(t *testing.T) {
	dir := t.TempDir()
	port := livetest.FreePort(t)
	cfg := controlplane.Config{Name: "gate", Dir: dir, Components: []string{controlplane.APIServer},
		Datastore: "sqlite://" + filepath.Join(dir, "state.db"), Port: port,
		// Not loopback (the endpoint reconciler refuses it); nothing needs to answer there.
		AdvertiseAddress: "10.250.199.1", ServiceCIDR: "10.96.0.0/16", Tenant: true, ServerName: "gate.socialweb.localhost"}
	if err := controlplane.Prepare(cfg); err != nil {
		t.Fatal(err)
	}
	g, err := sleep.Listen(cfg.Name, cfg.ServerName, port, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	var (
		mu    sync.Mutex
		procs []*exec.Cmd
	)
	start := func() error {
		cmd := exec.Command(binary, "controlplane", "--config", filepath.Join(dir, controlplane.ConfigFile), "--listen-fd", "3")
		logf, err := os.OpenFile(filepath.Join(dir, "cp.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer logf.Close()
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.ExtraFiles = []*os.File{g.File()}
		if err := cmd.Start(); err != nil {
			return err
		}
		mu.Lock()
		procs = append(procs, cmd)
		mu.Unlock()
		return nil
	}
	stop := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, cmd := range procs {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
		}
		procs = nil
	}
	t.Cleanup(stop)
	client, err := controlplane.AdminHTTPClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitUp := func() error {
		deadline := time.Now().Add(2 * time.Minute)
		for controlplane.ProbeUp(context.Background(), client, cfg) != nil {
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(filepath.Join(dir, "cp.log"))
				return fmt.Errorf("the control plane is not up after 2m:\n%s", tail(string(b), 30))
			}
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	}
	as := func(id pki.Identity) kubernetes.Interface {
		rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig(id))
		if err != nil {
			t.Fatal(err)
		}
		return kubernetes.NewForConfigOrDie(rc)
	}

	t0 := time.Now()
	if err := start(); err != nil {
		t.Fatal(err)
	}
	if err := waitUp(); err != nil {
		t.Fatal(err)
	}
	t.Logf("first start: up in %s", time.Since(t0).Round(time.Millisecond))

	// The daemon's user is not activity; an admin's list is.
	before := controlplane.LastRequest(dir)
	time.Sleep(1100 * time.Millisecond) // the mark's resolution
	if _, err := as(pki.Daemon).CoreV1().Namespaces().List(ctxT(t, 30*time.Second), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if got := controlplane.LastRequest(dir); !got.Equal(before) {
		t.Errorf("the daemon's list moved last-request from %v to %v", before, got)
	}
	if _, err := as(pki.Admin).CoreV1().Pods("").List(ctxT(t, 30*time.Second), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if got := controlplane.LastRequest(dir); !got.After(before) {
		t.Errorf("an admin's list did not move last-request (%v, before %v)", got, before)
	}

	// Sleep: stop the process, gate the port (what the provider's OpSleep does).
	stop()
	woken := make(chan error, 1)
	var starts atomic.Int32
	if err := g.Sleep(func() {
		starts.Add(1)
		go func() {
			if err := start(); err != nil {
				woken <- err
				return
			}
			err := waitUp()
			took, ok := g.Awake()
			t.Logf("the gate passed the waking connection on %s after it arrived (%v)", took.Round(time.Millisecond), ok)
			woken <- err
		}()
	}); err != nil {
		t.Fatal(err)
	}
	// A bare connection, held past the gate's hello timeout (5 s), and a
	// client whose kubeconfig names no server (the daemon's: Go sends no SNI
	// for 127.0.0.1) leave it asleep.
	bare, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	_ = bare.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := bare.Read(make([]byte, 1)); n != 0 || err == nil || os.IsTimeout(err) {
		t.Errorf("a bare connection read %d bytes, %v; want it closed by the gate without an answer", n, err)
	}
	_, err = as(pki.Daemon).CoreV1().Namespaces().List(ctxT(t, 30*time.Second), metav1.ListOptions{})
	if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Errorf("the daemon's list against the sleeping port: %v; want the unrecognized_name alert", err)
	}
	if n := starts.Load(); n != 0 || !g.Listening() {
		t.Fatalf("%d starts, gate accepting %v: a bare connection or a client naming nothing woke the cluster", n, g.Listening())
	}
	t1 := time.Now()
	pods, err := as(pki.Admin).CoreV1().Pods("").List(ctxT(t, time.Minute), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("a list against the sleeping port: %v", err)
	}
	t.Logf("a list against the sleeping port was answered in %s (%d pods)", time.Since(t1).Round(time.Millisecond), len(pods.Items))
	if err := <-woken; err != nil {
		t.Fatal(err)
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("%d starts, want 1", n)
	}
}
