package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/k3s-io/kine/pkg/endpoint"
	"github.com/socialweb-computer/socialweb/internal/join"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/spf13/pflag"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	cliflag "k8s.io/component-base/cli/flag"
	basecompatibility "k8s.io/component-base/compatibility"
	logsapi "k8s.io/component-base/logs/api/v1"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	cmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	scheduleroptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

// Run starts the configured components and blocks until ctx ends or one of
// them fails; either way every component is stopped before it returns. It is
// meant to be called once per process: the Kubernetes components keep
// process-wide state (metrics registries, feature gates, klog).
func Run(parent context.Context, c Config, log *slog.Logger) error {
	if err := os.Chdir(c.WorkDir()); err != nil {
		return fmt.Errorf("entering control-plane dir: %w", err)
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()

	// Marks are earned by this run: not up, not seeded, until it says so.
	if err := clearMarks(c.WorkDir()); err != nil {
		return fmt.Errorf("clearing the marks of %s: %w", c.Name, err)
	}
	start := time.Now()
	// kine outlives the components, so they can finish their last writes
	// and close their watches while shutting down.
	kineCtx, stopKine := context.WithCancel(context.WithoutCancel(parent))
	defer stopKine()
	if _, err := endpoint.Listen(kineCtx, kineConfig(c)); err != nil {
		return fmt.Errorf("starting kine for %s: %w", c.Name, err)
	}
	log.Info("datastore up", "elapsed", time.Since(start).Round(time.Millisecond))
	var seed *seeder
	if c.SeedDir != "" {
		// While the apiserver starts, which takes longer than seeding.
		seed = startSeeding(ctx, kineEndpoint, c.SeedDir, c.WorkDir(), !c.SeedReadOnly, log)
		defer seed.close()
	}

	gateway := ""
	if c.Tenant {
		gateway = c.AdvertiseAddress
	}
	l, err := listenDual(c.Port, c.ListenFD, gateway, privateSocket, log)
	if err != nil {
		return fmt.Errorf("listening on port %d: %w", c.Port, err)
	}
	done := make(chan error, 4) // apiserver, controller-manager, node approver, scheduler
	apiDone := make(chan struct{})
	go func() {
		err := wrap(APIServer, runAPIServer(ctx, c, l, log))
		close(apiDone)
		done <- err
	}()
	if err := waitReady(ctx, c, done); err != nil {
		l.Close()
		return err
	}
	l.Open()
	log.Info("apiserver ready", "url", c.URL(), "elapsed", time.Since(start).Round(time.Millisecond))
	// Before the controller-manager starts changing what the seed is made of.
	seed.ready(ctx)
	if !policyCurrent(c.WorkDir()) {
		go recordPolicyBuild(ctx, c, log)
	}
	if c.Tenant {
		if err := bootstrapTenant(ctx, c); err != nil {
			return fmt.Errorf("bootstrapping %s for node joins: %w", c.Name, err)
		}
	}
	if err := setMark(c.WorkDir(), upMark); err != nil {
		return fmt.Errorf("marking %s up: %w", c.Name, err)
	}
	log.Info("control plane up", "elapsed", time.Since(start).Round(time.Millisecond))

	running := 1
	if c.Has(ControllerManager) {
		running++
		go func() { done <- wrap(ControllerManager, runControllerManager(ctx, c)) }()
		if c.Tenant {
			running++
			go func() { done <- wrap(nodeApprover, runNodeApprover(ctx, c, log)) }()
		}
	}
	if c.Has(Scheduler) {
		running++
		go func() { done <- wrap(Scheduler, runScheduler(ctx, c)) }()
	}

	err = <-done
	cancel()
	// The apiserver drains its requests before it returns. Once it has, no other
	// component can write anything, so they get a moment, not a long wait: a
	// replacement (a rolling upgrade) waits for this exit with its clients held.
	select {
	case <-apiDone:
	case <-time.After(5 * time.Second):
	}
	deadline := time.After(500 * time.Millisecond)
	for running--; running > 0; running-- {
		select {
		case <-done:
		case <-deadline:
			running = 0
		}
	}
	if parent.Err() != nil {
		return nil
	}
	return err
}

// kineEndpoint is where kine listens: a socket in the working directory,
// which the process sets to c.WorkDir(), since a unix socket path has a length
// limit.
const kineEndpoint = "unix://kine.sock"

// kineConfig is kine's own command-line defaults, with a smaller idle
// connection pool: a tenant is one apiserver, not a fleet.
func kineConfig(c Config) endpoint.Config {
	cfg := endpoint.Config{
		Listener:            kineEndpoint,
		Endpoint:            c.Datastore,
		NotifyInterval:      5 * time.Second,
		EmulatedETCDVersion: "3.6.11",
		CompactInterval:     5 * time.Minute,
		CompactTimeout:      5 * time.Second,
		CompactMinRetain:    1000,
		CompactBatchSize:    1000,
		PollBatchSize:       500,
		PollInterval:        time.Second,
	}
	cfg.ConnectionPoolConfig.MaxIdle = 5
	cfg.ConnectionPoolConfig.MaxIdleTime = 2 * time.Minute
	return cfg
}

func wrap(component string, err error) error {
	if err == nil {
		return fmt.Errorf("%s stopped", component)
	}
	return fmt.Errorf("%s: %w", component, err)
}

// parse fills a component's options from command-line style arguments, the
// interface every Kubernetes component documents and keeps stable.
func parse(name string, sets cliflag.NamedFlagSets, args []string) error {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	for _, f := range sets.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s flags: %w", name, err)
	}
	return nil
}

func runAPIServer(ctx context.Context, c Config, l net.Listener, log *slog.Logger) error {
	s := apiserveroptions.NewServerRunOptions()
	args := apiserverArgs(c)
	if c.egressWalled() {
		flag, err := startEgress(ctx, c, log.With("component", "egress"))
		if err != nil {
			return err
		}
		args = append(args, flag)
	}
	if err := parse("kube-apiserver", s.Flags(), args); err != nil {
		return err
	}
	s.SecureServing.Listener = l
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	fg := s.GenericServerRunOptions.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent)
	if err := logsapi.ValidateAndApply(s.Logs, fg); err != nil {
		return err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return errors.Join(errs...)
	}
	if !c.Tenant {
		return apiserverapp.Run(ctx, completed)
	}
	return runTracked(ctx, completed, c.WorkDir())
}

// runTracked is apiserverapp.Run with the activity filter (activity.go) around
// the API handler, inside authentication, so it knows who asked.
func runTracked(ctx context.Context, opts apiserveroptions.CompletedOptions, dir string) error {
	if opts.InformerName == nil {
		name, err := cache.NewInformerName("kube-apiserver")
		if err != nil {
			return err
		}
		opts.InformerName = name
	}
	config, err := apiserverapp.NewConfig(opts)
	if err != nil {
		return err
	}
	gc := &config.Aggregator.GenericConfig.Config
	build := gc.BuildHandlerChainFunc
	gc.BuildHandlerChainFunc = func(h http.Handler, c *genericapiserver.Config) http.Handler {
		return build(trackActivity(h, dir), c)
	}
	completed, err := config.Complete()
	if err != nil {
		return err
	}
	server, err := apiserverapp.CreateServerChain(completed)
	if err != nil {
		return err
	}
	prepared, err := server.PrepareRun()
	if err != nil {
		return err
	}
	return prepared.Run(ctx)
}

func runControllerManager(ctx context.Context, c Config) error {
	s, err := cmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return err
	}
	known, disabled, aliases := cmapp.KnownControllers(), cmapp.ControllersDisabledByDefault(), cmapp.ControllerAliases()
	sets := s.Flags(known, disabled, aliases)
	s.ParsedFlags = &sets
	if err := parse("kube-controller-manager", sets, controllerManagerArgs(c)); err != nil {
		return err
	}
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	cfg, err := s.Config(ctx, known, disabled, aliases)
	if err != nil {
		return err
	}
	return cmapp.Run(ctx, cfg.Complete())
}

// csrApprovingController is kube-controller-manager's CSR approver, which
// join.RunApprover replaces in a tenant (see there for why).
const csrApprovingController = "certificatesigningrequest-approving-controller"

// nodeApprover names join.RunApprover among the components in errors.
const nodeApprover = "node certificate approver"

// runNodeApprover runs join.RunApprover with the control plane's admin
// credentials until ctx ends; an early return is an error.
func runNodeApprover(ctx context.Context, c Config, log *slog.Logger) error {
	restCfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig(pki.Admin))
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	if err := join.RunApprover(ctx, kube, log.With("component", "node-approver")); err != nil {
		return err
	}
	if ctx.Err() == nil {
		return errors.New("returned early")
	}
	return nil
}

func runScheduler(ctx context.Context, c Config) error {
	opts := scheduleroptions.NewOptions()
	if err := parse("kube-scheduler", *opts.Flags, schedulerArgs(c)); err != nil {
		return err
	}
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	cc, sched, err := schedulerapp.Setup(ctx, opts)
	if err != nil {
		return err
	}
	return schedulerapp.Run(ctx, cc, sched)
}

// waitReady polls /readyz with the admin identity until it answers 200, a
// component fails, or ctx ends.
func waitReady(ctx context.Context, c Config, done <-chan error) error {
	client, err := AdminHTTPClient(c)
	if err != nil {
		return err
	}
	// On the private socket: the port lets no one in before this says ready.
	client.Transport.(*http.Transport).DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", privateSocket)
	}
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if Probe(ctx, client, c) == nil {
			return nil
		}
	}
}

// AdminHTTPClient is an HTTPS client that trusts only the cluster's server CA
// and presents the admin certificate.
func AdminHTTPClient(c Config) (*http.Client, error) {
	p := c.PKI()
	certPath, keyPath := p.Cert(pki.Admin)
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("loading admin certificate: %w", err)
	}
	caPEM, err := os.ReadFile(p.ServerCA)
	if err != nil {
		return nil, fmt.Errorf("reading server CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}},
	}, nil
}

// ProbeUp returns nil when the control plane answers its readiness path
// and its current run has finished its start-up work: the objects upstream
// makes just after it serves, outside any readiness check (the system
// namespaces, the kubernetes Service), and for a tenant what nodes need to
// join. This is what Ready means for a Cluster.
func ProbeUp(ctx context.Context, client *http.Client, c Config) error {
	if !hasMark(c.WorkDir(), upMark) {
		return errors.New("the control plane is still starting up")
	}
	return Probe(ctx, client, c)
}

// Probe returns nil when the control plane's readiness path (ReadyzPath)
// answers 200.
func Probe(ctx context.Context, client *http.Client, c Config) error {
	return probePath(ctx, client, c, ReadyzPath(c.WorkDir()))
}

func probePath(ctx context.Context, client *http.Client, c Config, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL()+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz answered %s", resp.Status)
	}
	return nil
}
