// Command hosts measures issue 41's figures of several hosts sharing one management
// API over one PostgreSQL server, side by side in one run. Three daemons (h1, h2, h3)
// serve in the root network namespace with --node-network=false (clusters are
// loopback-only, without nodes or VMs) and no front door, each with its own state dir,
// management API port and --cgroup-parent "", all on one --port-range (a tenant's port
// comes from one table for the service, so the host that takes a tenant over serves it
// on the same port and its kubeconfig keeps working), h2 and h3 with h1's cluster key.
//
//  1. Management API latency, 3 hosts against 1: -n GETs of a Cluster, -n LISTs of
//     Clusters and -n create+delete of a ConfigMap in socialweb-system through h1's
//     management API with h1 alone on PostgreSQL (one tenant, hb-a), then with three
//     hosts and three tenants through h1 and through h3: p50/p90/p99 and the ratios.
//  2. PostgreSQL load over -window each, after -settle of quiet: pg_stat_database deltas
//     (transactions: xact_commit+xact_rollback; tup_returned, tup_fetched, tup_inserted,
//     tup_updated, tup_deleted) and pg_stat_activity's connections (the most seen, by
//     database and by role). socialweb_mgmt with 1 host and with 3 hosts, one idle tenant
//     each time (the per-host cost); then 3 hosts and 3 tenants (the mgmt cost per
//     tenant), two idle and one active (a client updating a ConfigMap every 100 ms and
//     listing Pods every second through its kubeconfig); and from those a paper estimate
//     for 100 hosts and 10,000 tenants.
//  3. Failover time, -rounds times: the tenant on h2 answers a GET of namespaces; h2's
//     daemon and every control plane it ran are killed with SIGKILL at once; the tenant's
//     Lease (socialweb-system/tenant-NAME, read through h1 every 100 ms) is taken by
//     another host, and the tenant is asked (GET namespaces, 1 s timeout, every 100 ms)
//     with its kubeconfig until it answers: kill -> first answer, split into kill -> the
//     first other host logging h2's Lease lapsed -> Lease taken -> answering. Then the
//     moved tenant is deleted, h2 comes back (a new daemon on the same state dir, which
//     waits one Lease duration before it runs anything), and once its host Lease was
//     renewed twice (as it joined, and after its wait) and every host polled since, a new
//     tenant is placed on it. Whether another host saw h2's Lease lapse again between its
//     join and its next renewal is reported too.
//     With -also-lease D, a second service of three hosts with --host-lease-duration D
//     (30s is the default's) repeats the rounds.
//  4. Where a sleeping tenant wakes, -wake-rounds times (wake.go), on a new service of
//     two hosts with front doors (h1's the service address, no tenant cap): a tenant
//     asleep on h1, which runs two other tenants, asked through h1's door, wakes on h2 (away); asleep
//     on h2, it wakes there (home); asleep again, h2 is drained and it moves to h1
//     asleep. The first request's time to its answer, away against home, side by side.
//     -wake-only runs this part alone.
//
// Every host has --max-tenants 2, not 1: with 1, the killed host's tenant would find no
// host under its cap and stay unplaced. Placement still puts one tenant per host: hb-a is
// created while h1 is alone, and each next tenant goes to the host with the most memory
// left after 384 MiB per tenant it holds, an empty one (checked).
//
// Before the run and after it the bench drops databases socialweb_mgmt and
// socialweb_t_hb_* and their roles, so it starts a new service: run it where no other
// service uses the server, under the lock the live tests take. Everything it starts
// (daemons, control planes, state dirs) is removed at the end, also after a failure or
// an interrupt.
//
//	flock /tmp/live.lock go run ./bench/hosts -bin bin/socialweb [-postgres URL] [-lease 6s]
//	    [-also-lease 30s] [-rounds 3] [-n 500] [-window 60s] [-settle 30s] [-port-range 7600-7609]
//	    [-wake-rounds 3] [-wake-only] [-keep-logs]
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"maps"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/bench/internal/benchd"
	"github.com/socialweb-computer/socialweb/internal/datastore"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// prefix starts every tenant name of the bench; its databases are socialweb_t_hb_*.
const prefix = "hb-"

type options struct {
	bin, postgres, portRange string
	lease, alsoLease         time.Duration
	window, settle           time.Duration
	rounds, n                int
	wakeRounds               int
	wakeOnly                 bool
	keepLogs                 bool
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin/socialweb", "the socialweb binary")
	flag.StringVar(&o.postgres, "postgres", "postgres://postgres:socialweb@127.0.0.1:5432/postgres?sslmode=disable", "admin URL of the PostgreSQL server (the daemons' --datastore)")
	flag.DurationVar(&o.lease, "lease", 6*time.Second, "--host-lease-duration of the hosts")
	flag.DurationVar(&o.alsoLease, "also-lease", 0, "also run the failover rounds on a second service with this --host-lease-duration (30s: the default's); 0: none")
	flag.IntVar(&o.rounds, "rounds", 3, "failover rounds")
	flag.IntVar(&o.n, "n", 500, "requests of each kind in a latency run")
	flag.DurationVar(&o.window, "window", 60*time.Second, "each PostgreSQL load window")
	flag.DurationVar(&o.settle, "settle", 30*time.Second, "quiet time before each window (a tenant's first seconds, a host's join, write more than later)")
	flag.StringVar(&o.portRange, "port-range", "7600-7609", "the hosts' shared --port-range (tenant apiservers, on loopback)")
	flag.IntVar(&o.wakeRounds, "wake-rounds", 3, "rounds of a sleeping tenant woken away from and on its host (0: none)")
	flag.BoolVar(&o.wakeOnly, "wake-only", false, "run only the wake rounds")
	flag.BoolVar(&o.keepLogs, "keep-logs", false, "keep the daemons' logs (printed where) also after a successful run")
	flag.Parse()
	if o.rounds < 1 || o.n < 1 || o.window < 5*time.Second || o.settle < 0 || o.wakeRounds < 0 || o.wakeOnly && o.wakeRounds < 1 {
		log.Fatal("-rounds and -n must be at least 1, -window at least 5s, -settle and -wake-rounds not negative, -wake-only needs -wake-rounds of 1 or more")
	}
	abs, err := filepath.Abs(o.bin)
	if err != nil {
		log.Fatal(err)
	}
	o.bin = abs
	os.Exit(run(o))
}

// fatal is what fail panics with; run recovers it.
type fatal string

func fail(format string, args ...any) { panic(fatal(fmt.Sprintf(format, args...))) }

type bench struct {
	o        options
	ctx      context.Context
	db       *sql.DB
	hosts    [3]*host
	lease    time.Duration // the service's --host-lease-duration
	doors    bool          // hosts started now serve front doors (the wake rounds)
	door     [3]int        // each host's door port, while doors
	logs     []string      // every daemon log, for the end
	failed   bool
	cleanups []func()
}

// host is one daemon of the service; d is replaced when it comes back after a kill.
type host struct {
	name, state string
	apiPort     int
	args        []string
	d           *benchd.Daemon
	kube        kubernetes.Interface
	dyn         dynamic.Interface
}

func run(o options) (code int) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	b := &bench{o: o, ctx: ctx}
	defer b.cleanup() // before stop: an interrupt during the cleanup does not end it
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatal)
			if !ok {
				panic(r)
			}
			log.Printf("FAILED: %s", f)
			b.failed, code = true, 1
		}
	}()
	started := time.Now()
	load0 := loadavg()

	db, err := sql.Open("pgx", o.postgres)
	if err != nil {
		fail("%v", err)
	}
	db.SetMaxOpenConns(1) // one connection of the bench's own, left out of the counts
	b.db = db
	b.defer_(func() { db.Close() })
	var maxConns string
	if err := db.QueryRowContext(ctx, "SHOW max_connections").Scan(&maxConns); err != nil {
		fail("PostgreSQL at %s: %v (start it: pg_ctlcluster $(pg_lsclusters -h|awk 'NR==1{print $1}') main start)", redactURL(o.postgres), err)
	}
	var pgVersion string
	_ = db.QueryRowContext(ctx, "SHOW server_version").Scan(&pgVersion)
	b.dropDatabases()
	b.defer_(b.dropDatabases)

	r := report{lease: o.lease, maxConns: maxConns, pgVersion: pgVersion}
	if o.wakeOnly {
		r.wake = b.wakeRounds()
		r.header = b.header(started, load0, pgVersion)
		fmt.Printf("\n%s\n\n## Where a sleeping tenant wakes (2 hosts with front doors, --host-lease-duration %s)\n\n", r.header, o.lease)
		printWake(r.wake)
		return 0
	}

	// One host, one tenant.
	b.startService(o.lease, 1)
	h1 := b.hosts[0]
	a := prefix + "a"
	if on := b.create(a); on != "h1" {
		fail("%s, created with h1 alone, is on %q", a, on)
	}
	b.settle()
	log.Printf("latency, 1 host, through h1 (%d of each)", o.n)
	r.lat1 = b.latency(h1, a)
	log.Printf("PostgreSQL window, 1 host (%s)", o.window)
	r.w1 = b.window("1 host, 1 idle tenant", nil)

	// Three hosts.
	b.startHost(1, o.lease)
	b.startHost(2, o.lease)
	b.waitLive(h1, "h1", "h2", "h3")
	log.Printf("PostgreSQL window, 3 hosts (%s)", o.window)
	r.w2 = b.window("3 hosts, 1 idle tenant", nil)
	on := map[string]string{} // host -> tenant
	on["h1"] = a
	for _, n := range []string{prefix + "b", prefix + "c"} {
		h := b.create(n)
		if on[h] != "" {
			fail("tenant %s placed on %s, which runs %s already: want one tenant per host", n, h, on[h])
		}
		on[h] = n
	}
	log.Printf("tenants: %v", on)
	b.settle()
	log.Printf("latency, 3 hosts, through h1 and h3 (%d of each)", o.n)
	r.lat3h1 = b.latency(h1, a)
	r.lat3h3 = b.latency(b.hosts[2], a)
	r.idle = []string{on["h1"], on["h2"]}
	r.active = on["h3"]
	log.Printf("PostgreSQL window, 3 hosts, 3 tenants, %s active (%s)", r.active, o.window)
	activeCfg := b.tenantConfig(r.active)
	r.w3 = b.window("3 hosts, 3 tenants", func(ctx context.Context) string { return activeClient(ctx, activeCfg) })

	// Failover.
	r.rounds = b.failoverRounds(on["h2"])

	if o.alsoLease > 0 {
		log.Printf("a second service, --host-lease-duration %s, for the failover rounds", o.alsoLease)
		b.stopService()
		b.dropDatabases()
		b.startService(o.alsoLease, 3)
		var victim string
		for _, n := range []string{prefix + "a", prefix + "b", prefix + "c"} {
			if h := b.create(n); h == "h2" {
				victim = n
			}
		}
		if victim == "" {
			fail("no tenant of three was placed on h2")
		}
		r.alsoLease = o.alsoLease
		r.alsoRounds = b.failoverRounds(victim)
	}

	if o.wakeRounds > 0 {
		r.wake = b.wakeRounds()
	}
	r.header = b.header(started, load0, pgVersion)
	r.print(o)
	return 0
}

// header says when the run was, how loaded the machine, and what ran.
func (b *bench) header(started time.Time, load0, pgVersion string) string {
	rev, _ := exec.Command(b.o.bin, "--version").CombinedOutput()
	return fmt.Sprintf("%s .. %s UTC; load average before %s, after %s; %s; PostgreSQL %s",
		started.UTC().Format("2006-01-02 15:04:05"), time.Now().UTC().Format("15:04:05"), load0, loadavg(),
		strings.TrimSpace(firstLine(string(rev))), pgVersion)
}

// defer_ registers f to run at the end, last registered first.
func (b *bench) defer_(f func()) { b.cleanups = append(b.cleanups, f) }

func (b *bench) cleanup() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		func() {
			defer func() {
				if r := recover(); r != nil {
					log.Printf("cleanup: %v", r)
				}
			}()
			b.cleanups[i]()
		}()
	}
	b.cleanups = nil
	for _, l := range b.logs {
		if b.failed || b.o.keepLogs {
			log.Printf("daemon log: %s", l)
		} else {
			os.Remove(l)
		}
	}
}

// dropDatabases drops the management database and every tenant database of the
// bench's names, and their roles.
func (b *bench) dropDatabases() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := []string{datastore.DatabaseName("mgmt")}
	tp := datastore.DatabaseName(prefix)
	rows, err := b.db.QueryContext(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, $1)
		UNION SELECT rolname FROM pg_roles WHERE starts_with(rolname, $1)`, tp)
	if err != nil {
		log.Printf("listing the bench's databases: %v", err)
	} else {
		for rows.Next() {
			var n string
			if rows.Scan(&n) == nil {
				names = append(names, n)
			}
		}
		rows.Close()
	}
	for _, n := range names {
		if _, err := b.db.ExecContext(ctx, `DROP DATABASE IF EXISTS "`+n+`" WITH (FORCE)`); err != nil {
			log.Printf("drop database %s: %v", n, err)
		}
		if _, err := b.db.ExecContext(ctx, `DROP ROLE IF EXISTS "`+n+`"`); err != nil {
			log.Printf("drop role %s: %v", n, err)
		}
	}
}

// startService starts hosts h1..hN of a new service (h1 first: it makes the cluster
// key) and registers their stop.
func (b *bench) startService(lease time.Duration, n int) {
	b.hosts, b.lease = [3]*host{}, lease
	b.defer_(b.stopService)
	for i := range n {
		b.startHost(i, lease)
	}
	if n > 1 {
		names := []string{}
		for i := range n {
			names = append(names, b.hosts[i].name)
		}
		b.waitLive(b.hosts[0], names...)
	}
}

// stopService stops every host at once (one by one, the hosts left would take over
// the tenants of the first stopped), then what each left, and removes their state.
func (b *bench) stopService() {
	var wg sync.WaitGroup
	for _, h := range b.hosts {
		if h == nil {
			continue
		}
		wg.Go(func() {
			if h.d != nil {
				h.d.Stop()
				return
			}
			_, _ = exec.Command(b.o.bin, "down", "--state-dir", h.state).CombinedOutput()
			os.RemoveAll(h.state)
		})
	}
	wg.Wait()
	for _, h := range b.hosts {
		if h == nil {
			continue
		}
		if pids := processesOf(h.state); len(pids) > 0 {
			log.Printf("ERROR: processes of %s (%s) left after its stop: %v; killing them", h.name, h.state, pids)
			b.failed = true
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	}
	b.hosts = [3]*host{}
}

// startHost starts host i (h1, h2, h3) of the service.
func (b *bench) startHost(i int, lease time.Duration) {
	state, err := os.MkdirTemp("", "socialweb-bench-hosts-")
	if err != nil {
		fail("%v", err)
	}
	h := &host{name: fmt.Sprintf("h%d", i+1), state: state, apiPort: benchd.FreePort()}
	h.args = []string{"--datastore", b.o.postgres, "--host-name", h.name, "--api-port", strconv.Itoa(h.apiPort),
		"--port-range", b.o.portRange, "--metrics-address", "", "--node-network=false", "--cgroup-parent", "",
		"--host-lease-duration", lease.String(), "--max-tenants", "2"}
	if i > 0 {
		h.args = append(h.args, "--cluster-key-file", filepath.Join(b.hosts[0].state, "cluster.key"))
	}
	if b.doors {
		// One loopback for all: each host its own door and registry peer port.
		if i == 0 {
			b.door = [3]int{benchd.FreePort(), benchd.FreePort(), benchd.FreePort()}
		}
		h.args = append(h.args, "--max-tenants", "0", "--host-address", "127.0.0.1", "--front-door", fmt.Sprintf("127.0.0.1:%d", b.door[i]),
			"--service-address", fmt.Sprintf("127.0.0.1:%d", b.door[0]), "--registry-peer-address", fmt.Sprintf("127.0.0.1:%d", benchd.FreePort()))
	}
	b.hosts[i] = h
	b.logs = append(b.logs, state+".log")
	t0 := time.Now()
	d, err := benchd.Serve(b.o.bin, state, h.args...)
	if err != nil {
		fail("%s: %v", h.name, err)
	}
	h.d = d
	log.Printf("%s serves (%s; state %s) after %s", h.name, lease, state, time.Since(t0).Round(100*time.Millisecond))
}

// restart serves h again from its state dir, once its management API's port is free
// (a control plane killed a moment ago may still be closing its listener).
func (b *bench) restart(h *host) {
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(h.apiPort)))
		if err == nil {
			l.Close()
			break
		}
		if time.Now().After(end) {
			fail("%s's management API port %d still in use 30s after its kill", h.name, h.apiPort)
		}
	}
	d, err := benchd.Serve(b.o.bin, h.state, h.args...)
	if err != nil {
		fail("%s, back: %v", h.name, err)
	}
	h.d = d
}

// cli runs a socialweb command against h; it ends with the bench.
func (b *bench) cli(h *host, args ...string) (string, error) {
	out, err := exec.CommandContext(b.ctx, b.o.bin, append(args, "--state-dir", h.state)...).CombinedOutput()
	if b.ctx.Err() != nil {
		fail("interrupted")
	}
	return string(out), err
}

// clients are h's management API clients (its admin kubeconfig), QPS and Burst raised.
func (b *bench) clients(h *host) (kubernetes.Interface, dynamic.Interface) {
	if h.kube == nil {
		cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(h.state, "admin.kubeconfig"))
		if err != nil {
			fail("%s's admin kubeconfig: %v", h.name, err)
		}
		cfg.QPS, cfg.Burst = 1000, 1000
		cfg.Timeout = 30 * time.Second
		h.kube, h.dyn = kubernetes.NewForConfigOrDie(cfg), dynamic.NewForConfigOrDie(cfg)
	}
	return h.kube, h.dyn
}

// waitLive waits until `host list` on h shows every host of names live.
func (b *bench) waitLive(h *host, names ...string) {
	var out string
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		out, _ = b.cli(h, "host", "list")
		all := true
		for _, n := range names {
			if !hostLine(out, n, "yes") {
				all = false
			}
		}
		if all {
			return
		}
	}
	fail("hosts %v not all live in `host list` on %s within 1m:\n%s", names, h.name, out)
}

func hostLine(out, host, live string) bool {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == host && f[1] == live {
			return true
		}
	}
	return false
}

// create makes a tenant through h1 and waits until it is Ready; it returns the host
// it was placed on.
func (b *bench) create(name string) string {
	t0 := time.Now()
	if out, err := b.cli(b.hosts[0], "cluster", "create", name, "--wait", "--timeout", "5m"); err != nil {
		fail("cluster create %s: %v\n%s", name, err, out)
	}
	on := b.placedOn(name)
	log.Printf("tenant %s Ready on %s after %s", name, on, time.Since(t0).Round(100*time.Millisecond))
	return on
}

// placedOn is the Cluster's status.host, read through h1.
func (b *bench) placedOn(name string) string {
	_, dyn := b.clients(b.hosts[0])
	u, err := dyn.Resource(v1.ClusterResource).Get(b.ctx, name, metav1.GetOptions{})
	if err != nil {
		fail("reading Cluster %s: %v", name, err)
	}
	h, _, _ := unstructured.NestedString(u.Object, "status", "host")
	return h
}

// tenantConfig is the tenant's admin kubeconfig (through h1), as a client config.
func (b *bench) tenantConfig(name string) *rest.Config {
	kc, err := b.cli(b.hosts[0], "cluster", "kubeconfig", name)
	if err != nil {
		fail("cluster kubeconfig %s: %v\n%s", name, err, kc)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		fail("the kubeconfig of %s: %v", name, err)
	}
	cfg.QPS, cfg.Burst = 100, 100
	return cfg
}

// ---- 1. Management API latency

type dist []time.Duration

func (d dist) pct(q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

type latencies struct{ get, list, cd dist }

// latency times o.n GETs of Cluster get, o.n LISTs of Clusters and o.n create+delete
// of a ConfigMap in socialweb-system through h's management API, one at a time,
// after 20 of each unmeasured.
func (b *bench) latency(h *host, get string) latencies {
	kube, dyn := b.clients(h)
	clusters := dyn.Resource(v1.ClusterResource)
	cms := kube.CoreV1().ConfigMaps(v1.SystemNamespace)
	var l latencies
	op := func(what string, f func() error) time.Duration {
		t0 := time.Now()
		if err := f(); err != nil {
			fail("%s through %s: %v", what, h.name, err)
		}
		return time.Since(t0)
	}
	ctx := b.ctx
	for i := range 20 + b.o.n {
		d := op("GET Cluster", func() error { _, err := clusters.Get(ctx, get, metav1.GetOptions{}); return err })
		if i >= 20 {
			l.get = append(l.get, d)
		}
	}
	for i := range 20 + b.o.n {
		d := op("LIST Clusters", func() error { _, err := clusters.List(ctx, metav1.ListOptions{}); return err })
		if i >= 20 {
			l.list = append(l.list, d)
		}
	}
	for i := range 20 + b.o.n {
		name := fmt.Sprintf("bench-hosts-%s-%d", h.name, i)
		d := op("create+delete ConfigMap", func() error {
			if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
				return err
			}
			return cms.Delete(ctx, name, metav1.DeleteOptions{})
		})
		if i >= 20 {
			l.cd = append(l.cd, d)
		}
	}
	log.Printf("  %s: GET p50 %s, LIST p50 %s, create+delete p50 %s", h.name, ms(l.get.pct(.5)), ms(l.list.pct(.5)), ms(l.cd.pct(.5)))
	return l
}

// ---- 2. PostgreSQL load

// stat is one database's counters: transactions, tuples returned, fetched, inserted,
// updated, deleted.
type stat [6]float64

var statNames = [6]string{"xact/s", "returned/s", "fetched/s", "inserted/s", "updated/s", "deleted/s"}

type window struct {
	name    string
	secs    float64
	rate    map[string]stat // per database, per second
	conns   map[string]int  // per database, the most seen
	roles   map[string]int  // per role, the most seen
	total   int             // all client connections, the most seen (the bench's own excluded)
	samples int
	during  string
}

func (b *bench) pgStats() map[string]stat {
	rows, err := b.db.QueryContext(b.ctx, `SELECT datname, xact_commit+xact_rollback, tup_returned, tup_fetched, tup_inserted, tup_updated, tup_deleted
		FROM pg_stat_database WHERE starts_with(datname, 'socialweb_')`)
	if err != nil {
		fail("pg_stat_database: %v", err)
	}
	defer rows.Close()
	out := map[string]stat{}
	for rows.Next() {
		var n string
		var s [6]int64
		if err := rows.Scan(&n, &s[0], &s[1], &s[2], &s[3], &s[4], &s[5]); err != nil {
			fail("pg_stat_database: %v", err)
		}
		var f stat
		for i := range s {
			f[i] = float64(s[i])
		}
		out[n] = f
	}
	return out
}

// pgConns counts client connections by database and by role (the bench's own not).
func (b *bench) pgConns() (byDB, byRole map[string]int, total int) {
	rows, err := b.db.QueryContext(b.ctx, `SELECT coalesce(datname, ''), coalesce(usename, ''), count(*) FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() GROUP BY 1, 2`)
	if err != nil {
		fail("pg_stat_activity: %v", err)
	}
	defer rows.Close()
	byDB, byRole = map[string]int{}, map[string]int{}
	for rows.Next() {
		var d, u string
		var n int
		if err := rows.Scan(&d, &u, &n); err != nil {
			fail("pg_stat_activity: %v", err)
		}
		byDB[d] += n
		byRole[u] += n
		total += n
	}
	return byDB, byRole, total
}

// settle waits o.settle.
func (b *bench) settle() { b.sleep(b.o.settle) }

// window measures o.window of PostgreSQL load after o.settle of quiet, with during
// running meanwhile (its summary is kept).
func (b *bench) window(name string, during func(context.Context) string) window {
	w := window{name: name, conns: map[string]int{}, roles: map[string]int{}}
	b.settle()
	ctx, cancel := context.WithTimeout(b.ctx, b.o.window)
	defer cancel()
	done := make(chan string, 1)
	if during != nil {
		go func() { done <- during(ctx) }()
	}
	s0, t0 := b.pgStats(), time.Now()
	sample := func() {
		byDB, byRole, total := b.pgConns()
		for k, v := range byDB {
			w.conns[k] = max(w.conns[k], v)
		}
		for k, v := range byRole {
			w.roles[k] = max(w.roles[k], v)
		}
		w.total = max(w.total, total)
		w.samples++
	}
	sample()
	t := time.NewTicker(2 * time.Second)
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-t.C:
			sample()
		}
	}
	t.Stop()
	if b.ctx.Err() != nil {
		fail("interrupted")
	}
	s1, t1 := b.pgStats(), time.Now()
	w.secs = t1.Sub(t0).Seconds()
	w.rate = map[string]stat{}
	for n, v := range s1 {
		var r stat
		for i := range v {
			r[i] = (v[i] - s0[n][i]) / w.secs
		}
		w.rate[n] = r
	}
	if during != nil {
		w.during = <-done
	}
	log.Printf("  %s: mgmt %.1f xact/s, %d connections", name, w.rate["socialweb_mgmt"][0], w.conns["socialweb_mgmt"])
	return w
}

// activeClient updates a ConfigMap of the tenant cfg reaches every 100 ms and lists
// its Pods every second until ctx ends. It runs beside the bench: it never fails it.
func activeClient(ctx context.Context, cfg *rest.Config) string {
	cfg.Timeout = 10 * time.Second
	k := kubernetes.NewForConfigOrDie(cfg)
	cms := k.CoreV1().ConfigMaps("default")
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bench-active"}, Data: map[string]string{"n": "0"}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Sprintf("creating its ConfigMap: %v", err)
	}
	var updates, updateErrs, lists, listErrs int
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if _, err := k.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil {
				if ctx.Err() == nil {
					listErrs++
				}
			} else {
				lists++
			}
		}
	})
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			wg.Wait()
			return fmt.Sprintf("ConfigMap updates %d (%d failed), Pod lists %d (%d failed)", updates, updateErrs, lists, listErrs)
		case <-t.C:
		}
		cm.Data["n"] = strconv.Itoa(i)
		next, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		switch {
		case err == nil:
			cm = next
			updates++
		case ctx.Err() != nil:
		default:
			updateErrs++
			if apierrors.IsConflict(err) {
				if cur, err := cms.Get(ctx, cm.Name, metav1.GetOptions{}); err == nil {
					cm = cur
				}
			}
		}
	}
}

// ---- 3. Failover

type round struct {
	n                       int
	victim, to              string
	cps                     int           // processes killed with h2's daemon
	lapsed, taken, answered time.Duration // after the kill; lapsed < 0: not logged
	// relapsed is, after h2 came back, when another host logged its Lease lapsed
	// again, from its Join's renewal (< 0: none did); tries is how many tenants were created before one was
	// placed on h2, back (the next round's).
	relapsed time.Duration
	tries    int
}

// failoverRounds runs o.rounds failovers of h2, the first of tenant victim.
func (b *bench) failoverRounds(victim string) []round {
	var rounds []round
	for i := 1; i <= b.o.rounds; i++ {
		r := b.failover(i, victim)
		rounds = append(rounds, r)
		rp := &rounds[len(rounds)-1]
		log.Printf("round %d: %s from h2 to %s: lapse seen %s, Lease taken %s, answering %s after the kill",
			i, r.victim, r.to, secs(r.lapsed), secs(r.taken), secs(r.answered))
		if out, err := b.cli(b.hosts[0], "cluster", "delete", victim, "--wait", "--timeout", "3m"); err != nil {
			fail("cluster delete %s: %v\n%s", victim, err, out)
		}
		t0 := time.Now()
		b.restart(b.hosts[1])
		log.Printf("h2 back after %s", time.Since(t0).Round(100*time.Millisecond))
		// h2 renewed its Lease as it joined; it waits one Lease duration and renews
		// again a renewal period later. Wait that out (and another host's poll), then
		// look whether another host saw its Lease lapse meanwhile.
		joined := b.waitRenewed(t0)
		b.waitLive(b.hosts[0], "h2")
		rp.relapsed = -1
		for _, h := range []*host{b.hosts[0], b.hosts[2]} {
			if t, ok := logged(h.d.Log, joined, lapseOf("h2")); ok && (rp.relapsed < 0 || t.Sub(joined) < rp.relapsed) {
				rp.relapsed = t.Sub(joined)
			}
		}
		if d := rp.relapsed; d >= 0 {
			log.Printf("h2, back, was seen lapsed again by another host %s after it joined", secs(d))
		}
		if i == b.o.rounds {
			break
		}
		// A new tenant on h2: of the hosts, it is the one without a tenant.
		victim = ""
		for try := 'a'; try <= 'c'; try++ {
			n := fmt.Sprintf("%sr%d%c", prefix, i+1, try)
			rp.tries++
			if b.create(n) == "h2" {
				victim = n
				break
			}
			log.Printf("%s was not placed on h2: deleting it, another try", n)
			if out, err := b.cli(b.hosts[0], "cluster", "delete", n, "--wait", "--timeout", "3m"); err != nil {
				fail("cluster delete %s: %v\n%s", n, err, out)
			}
			b.sleep(3 * time.Second)
		}
		if victim == "" {
			fail("no new tenant was placed on h2, back")
		}
	}
	return rounds
}

// waitRenewed waits until h2, back, has renewed its host Lease twice since
// since (as it joined, and once it runs), then one renewal period more, in which
// every other host's poll sees the second renewal. It returns the first renewal's
// time: when h2 joined.
func (b *bench) waitRenewed(since time.Time) time.Time {
	kube, _ := b.clients(b.hosts[0])
	lease := b.lease
	var first *metav1.MicroTime
	for end := time.Now().Add(3*lease + time.Minute); ; b.sleep(200 * time.Millisecond) {
		l, err := kube.CoordinationV1().Leases(v1.SystemNamespace).Get(b.ctx, v1.HostLeaseName("h2"), metav1.GetOptions{})
		if err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(since) {
			if first == nil {
				first = l.Spec.RenewTime
			} else if !l.Spec.RenewTime.Equal(first) {
				log.Printf("h2 renewed its Lease %s after it joined", l.Spec.RenewTime.Sub(first.Time).Round(100*time.Millisecond))
				b.sleep(lease/3 + time.Second)
				return first.Time
			}
		}
		if time.Now().After(end) {
			fail("h2, back, did not renew its Lease twice within %s (last: %v, %v)", 3*lease+time.Minute, l, err)
		}
	}
}

// failover kills h2 with the control planes it ran and times victim's return.
func (b *bench) failover(n int, victim string) round {
	h2 := b.hosts[1]
	r := round{n: n, victim: victim, lapsed: -1}
	cfg := b.tenantConfig(victim)
	cfg.Timeout = time.Second
	k := kubernetes.NewForConfigOrDie(cfg)
	ask := func() error {
		ctx, cancel := context.WithTimeout(b.ctx, time.Second)
		defer cancel()
		_, err := k.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err
	}
	if err := ask(); err != nil {
		fail("round %d: %s does not answer before the kill: %v", n, victim, err)
	}
	kube, _ := b.clients(b.hosts[0])
	leases := kube.CoordinationV1().Leases(v1.SystemNamespace)
	holder := func(ctx context.Context) (string, error) {
		l, err := leases.Get(ctx, v1.TenantLeaseName(victim), metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		return ptr.Deref(l.Spec.HolderIdentity, ""), nil
	}
	if h, err := holder(b.ctx); err != nil || h != "h2" {
		fail("round %d: the Lease of %s is held by %q (%v), want h2", n, victim, h, err)
	}

	pids := processesOf(h2.state)
	for _, rec := range append([]string{filepath.Join(h2.state, "mgmt", "instance.json")}, globs(filepath.Join(h2.state, "clusters", "*", "instance.json"))...) {
		if id, ok, _ := supervisor.Running(rec); ok && !slices.Contains(pids, id.PID) {
			pids = append(pids, id.PID)
		}
	}
	for _, p := range pids {
		if p != h2.d.PID() {
			r.cps++
		}
	}

	// The Lease's holder, every 100 ms through h1, until another host holds it.
	wctx, stopWatch := context.WithCancel(b.ctx)
	defer stopWatch()
	type taken struct {
		at time.Time
		by string
	}
	took := make(chan taken, 1)
	go func() {
		for wctx.Err() == nil {
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(wctx, 2*time.Second)
			h, err := holder(ctx)
			cancel()
			if err == nil && h != "h2" && h != "" {
				took <- taken{time.Now(), h}
				return
			}
			time.Sleep(time.Until(t0.Add(100 * time.Millisecond)))
		}
	}()

	killed := time.Now()
	_ = syscall.Kill(h2.d.PID(), syscall.SIGKILL)
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	h2.d.Kill()
	log.Printf("round %d: killed h2 (daemon %d and %d control planes; %s on it)", n, h2.d.PID(), r.cps, victim)

	for {
		t0 := time.Now()
		if err := ask(); err == nil {
			r.answered = time.Since(killed)
			break
		}
		if b.ctx.Err() != nil {
			fail("interrupted")
		}
		if time.Since(killed) > 5*time.Minute {
			fail("round %d: %s did not answer within 5m of h2's kill", n, victim)
		}
		time.Sleep(time.Until(t0.Add(100 * time.Millisecond)))
	}
	select {
	case t := <-took:
		r.taken, r.to = t.at.Sub(killed), t.by
	case <-time.After(30 * time.Second):
		fail("round %d: %s answers, but its Lease still names h2 after 30s", n, victim)
	}
	if on := b.placedOn(victim); on != r.to {
		fail("round %d: %s's Lease is %s's, its status.host %q", n, victim, r.to, on)
	}
	for _, h := range []*host{b.hosts[0], b.hosts[2]} {
		if t, ok := logged(h.d.Log, killed, lapseOf("h2")); ok && (r.lapsed < 0 || t.Sub(killed) < r.lapsed) {
			r.lapsed = t.Sub(killed)
		}
	}
	return r
}

// lapseOf matches a daemon's log line telling that host's Lease lapsed.
func lapseOf(host string) func(map[string]any) bool {
	return func(e map[string]any) bool {
		return strings.HasPrefix(fmt.Sprint(e["msg"]), "a host's Lease lapsed") && e["host"] == host
	}
}

// sleep waits d, or fails on an interrupt.
func (b *bench) sleep(d time.Duration) {
	select {
	case <-b.ctx.Done():
		fail("interrupted")
	case <-time.After(d):
	}
}

// processesOf are the processes whose command line names state (the daemon's
// --state-dir, a control plane's config under it), the bench's own not.
func processesOf(state string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(raw), "\x00") {
			if a == state || strings.HasPrefix(a, state+"/") {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

func globs(pattern string) []string {
	m, _ := filepath.Glob(pattern)
	return m
}

// logged is the time of the first JSON log line of path after after that match
// takes.
func logged(path string, after time.Time, match func(map[string]any) bool) (time.Time, bool) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		s, _ := e["time"].(string)
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil || t.Before(after) {
			continue
		}
		if match(e) {
			return t, true
		}
	}
	return time.Time{}, false
}

// ---- The report

type report struct {
	header, maxConns, pgVersion string
	lease, alsoLease            time.Duration
	lat1, lat3h1, lat3h3        latencies
	w1, w2, w3                  window
	idle                        []string
	active                      string
	rounds, alsoRounds          []round
	wake                        []wakeRound
}

func (r report) print(o options) {
	fmt.Printf("\n%s\n", r.header)
	fmt.Printf("3 hosts (socialweb serve, root network namespace, --node-network=false, no front door, --max-tenants 2), one PostgreSQL; -n %d, -window %s, -rounds %d\n",
		o.n, o.window, o.rounds)

	fmt.Printf("\n## Failover (--host-lease-duration %s)\n\n", r.lease)
	printRounds(r.rounds)
	if r.alsoLease > 0 {
		fmt.Printf("\n## Failover (--host-lease-duration %s)\n\n", r.alsoLease)
		printRounds(r.alsoRounds)
	}

	if len(r.wake) > 0 {
		fmt.Printf("\n## Where a sleeping tenant wakes (2 hosts with front doors)\n\n")
		printWake(r.wake)
	}

	fmt.Printf("\n## Management API latency, 3 hosts against 1 (ms, one request at a time; %d of each)\n\n", o.n)
	fmt.Println("| request | 1 host, via h1: p50 / p90 / p99 | 3 hosts, via h1 | 3 hosts, via h3 | 3h/1h via h1: p50, p99 | 3h/1h via h3: p50, p99 |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, x := range []struct {
		what    string
		a, b, c dist
	}{{"GET Cluster", r.lat1.get, r.lat3h1.get, r.lat3h3.get}, {"LIST Clusters (1 / 3 items)", r.lat1.list, r.lat3h1.list, r.lat3h3.list},
		{"create+delete ConfigMap", r.lat1.cd, r.lat3h1.cd, r.lat3h3.cd}} {
		fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", x.what, pcts(x.a), pcts(x.b), pcts(x.c), ratios(x.b, x.a), ratios(x.c, x.a))
	}

	fmt.Printf("\n## PostgreSQL load (pg_stat_database deltas per second; connections: the most seen, sampled every 2 s)\n\n")
	fmt.Printf("Each window after %s of quiet; hosts renew their Lease every %s (a third of --host-lease-duration %s).\n", o.settle, r.lease/3, r.lease)
	for _, w := range []window{r.w1, r.w2, r.w3} {
		fmt.Printf("\n%s (%.0f s, %d samples)", w.name, w.secs, w.samples)
		if w.during != "" {
			fmt.Printf("; active client: %s", w.during)
		}
		fmt.Println()
		fmt.Printf("\n| database | %s | connections |\n|---|---|---|---|---|---|---|---|\n", strings.Join(statNames[:], " | "))
		dbs := slices.Sorted(maps.Keys(w.rate))
		for _, d := range dbs {
			s := w.rate[d]
			role := ""
			if d == "socialweb_t_"+strings.ReplaceAll(r.active, "-", "_") && w.during != "" {
				role = " (active)"
			} else if strings.HasPrefix(d, "socialweb_t_") {
				role = " (idle)"
			}
			fmt.Printf("| %s%s | %.1f | %.0f | %.0f | %.1f | %.1f | %.1f | %d |\n", d, role, s[0], s[1], s[2], s[3], s[4], s[5], w.conns[d])
		}
		var others []string
		for _, d := range slices.Sorted(maps.Keys(w.conns)) {
			if _, ok := w.rate[d]; !ok {
				others = append(others, fmt.Sprintf("%q %d", d, w.conns[d]))
			}
		}
		var roles []string
		for _, u := range slices.Sorted(maps.Keys(w.roles)) {
			roles = append(roles, fmt.Sprintf("%s %d", u, w.roles[u]))
		}
		fmt.Printf("\nconnections to other databases: %s; by role: %s; all client connections: %d\n", orNone(others), strings.Join(roles, ", "), w.total)
	}

	// Per tenant, per host.
	const mg = "socialweb_mgmt"
	db := func(t string) string { return datastore.DatabaseName(t) }
	var idleX, idleC float64
	for _, t := range r.idle {
		idleX += r.w3.rate[db(t)][0] / float64(len(r.idle))
		idleC += float64(r.w3.conns[db(t)]) / float64(len(r.idle))
	}
	actX, actC := r.w3.rate[db(r.active)][0], float64(r.w3.conns[db(r.active)])
	hostX := (r.w2.rate[mg][0] - r.w1.rate[mg][0]) / 2
	// A host's connections: its management API's to socialweb_mgmt and its daemon's
	// to "postgres" (the admin URL's database, where tenants' databases are made).
	hostConns := func(w window) int { return w.conns[mg] + w.conns["postgres"] }
	hostC := float64(r.w2.conns[mg]-r.w1.conns[mg]) / 2
	adminC := float64(r.w2.conns["postgres"]-r.w1.conns["postgres"]) / 2
	hostAll := float64(hostConns(r.w2)-hostConns(r.w1)) / 2
	tenMgmtX := (r.w3.rate[mg][0] - r.w2.rate[mg][0]) / 2
	tenMgmtUsed, tenMgmtNote := tenMgmtX, ""
	if tenMgmtX < 0 {
		tenMgmtUsed, tenMgmtNote = 0, " (below the noise: the estimate counts 0)"
	}
	fmt.Printf("\n## Per tenant, per host\n\n")
	fmt.Printf("- idle tenant (mean of %s): %.2f xact/s, %.1f connections\n", strings.Join(r.idle, ", "), idleX, idleC)
	fmt.Printf("- active tenant (%s): %.2f xact/s, %.0f connections\n", r.active, actX, actC)
	fmt.Printf("- management database, 1 host: %.2f xact/s, %d connections; 3 hosts: %.2f xact/s, %d connections\n",
		r.w1.rate[mg][0], r.w1.conns[mg], r.w2.rate[mg][0], r.w2.conns[mg])
	fmt.Printf("- per host ((3 hosts - 1 host) / 2): %.2f xact/s and %.1f connections on %s, %.1f on \"postgres\" (the daemon's admin)\n",
		hostX, hostC, mg, adminC)
	fmt.Printf("- %s per tenant ((3 tenants - 1) / 2, 3 hosts): %+.2f xact/s%s\n", mg, tenMgmtX, tenMgmtNote)

	// The paper estimate.
	const H, T, share = 100.0, 10000.0, 0.10
	mgmtX := r.w1.rate[mg][0] + (H-1)*hostX + (T-1)*tenMgmtUsed
	mgmtC := float64(hostConns(r.w1)) + (H-1)*hostAll
	tenX := T*(1-share)*idleX + T*share*actX
	tenC := T*(1-share)*idleC + T*share*actC
	mc, _ := strconv.Atoi(r.maxConns)
	fmt.Printf("\n## Paper estimate: %.0f hosts, %.0f tenants (%.0f%% active), every tenant awake\n\n", H, T, share*100)
	fmt.Printf("- tenants: %.0f idle x %.2f + %.0f active x %.2f = %.0f xact/s; %.0f x %.1f + %.0f x %.0f = %.0f connections\n",
		T*(1-share), idleX, T*share, actX, tenX, T*(1-share), idleC, T*share, actC, tenC)
	fmt.Printf("- hosts: %s %.2f (1 host) + %.0f x %.2f (hosts) + %.0f x %+.2f (tenants) = %.0f xact/s; %d + %.0f x %.1f = %.0f connections\n",
		mg, r.w1.rate[mg][0], H-1, hostX, T-1, tenMgmtUsed, mgmtX, hostConns(r.w1), H-1, hostAll, mgmtC)
	fmt.Printf("- in all: %.0f transactions/s and %.0f connections to one PostgreSQL server; its max_connections is %s (SHOW max_connections): %.0fx that\n",
		tenX+mgmtX, tenC+mgmtC, r.maxConns, (tenC+mgmtC)/float64(max(mc, 1)))
}

func printRounds(rs []round) {
	fmt.Println("| round | tenant | to | kill -> lapse seen (log) | kill -> Lease taken | taken -> answering | kill -> first answer | h2 back: seen lapsed again | next tenant: creates until on h2 |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	var ans, tak, rest, lap []float64
	for _, r := range rs {
		again, tries := "no", "-"
		if r.relapsed >= 0 {
			again = fmt.Sprintf("yes, %s after it joined", secs(r.relapsed))
		}
		if r.tries > 0 {
			tries = strconv.Itoa(r.tries)
		}
		fmt.Printf("| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.n, r.victim, r.to, secs(r.lapsed), secs(r.taken), secs(r.answered-r.taken), secs(r.answered), again, tries)
		ans, tak, rest = append(ans, r.answered.Seconds()), append(tak, r.taken.Seconds()), append(rest, (r.answered-r.taken).Seconds())
		if r.lapsed >= 0 {
			lap = append(lap, r.lapsed.Seconds())
		}
	}
	fmt.Printf("| median | | | %s | %.1f s | %.1f s | **%.1f s** | | |\n", medianCell(lap), median(tak), median(rest), median(ans))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianCell(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f s", median(v))
}

func pcts(d dist) string {
	return fmt.Sprintf("%s / %s / %s", ms(d.pct(.5)), ms(d.pct(.9)), ms(d.pct(.99)))
}

func ratios(a, base dist) string {
	return fmt.Sprintf("%.2fx, %.2fx", a.pct(.5).Seconds()/base.pct(.5).Seconds(), a.pct(.99).Seconds()/base.pct(.99).Seconds())
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", d.Seconds()*1000) }

func secs(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func redactURL(u string) string {
	if i, j := strings.Index(u, "://"), strings.LastIndex(u, "@"); i >= 0 && j > i {
		if k := strings.Index(u[i+3:j], ":"); k >= 0 {
			return u[:i+3+k+1] + "xxx" + u[j:]
		}
	}
	return u
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
