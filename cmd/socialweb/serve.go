package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"

	"github.com/socialweb-computer/socialweb/internal/daemon"
	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/hosts"
	"github.com/socialweb-computer/socialweb/internal/layershare"
	"github.com/socialweb-computer/socialweb/internal/logrotate"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
	"github.com/socialweb-computer/socialweb/internal/nodeservice"
	"github.com/socialweb-computer/socialweb/internal/registry"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

func newServeCommand(g *globalOptions) *cobra.Command {
	var (
		o         daemon.Options
		memory    string
		maxMemory string
		disk      string
		maxDisk   string
		logLevel  string
		gogc      string
		cpMemory  string
		cacheSize string
		quota     string

		buildCacheBudget string
		cpLogMaxSize     string
		upgrade          string
		onExit           string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: the management API and every tenant control plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := resource.ParseQuantity(memory)
			if err != nil {
				return usageError{errf("--default-node-memory %q: %v; want a quantity such as 1Gi or 512Mi", memory, err)}
			}
			o.Defaults.NodeMemory = q
			for _, f := range []struct {
				flag, v string
				to      *resource.Quantity
			}{
				{"--default-max-node-memory", maxMemory, &o.Defaults.MaxNodeMemory},
				{"--default-node-disk", disk, &o.Defaults.NodeDisk},
				{"--default-max-node-disk", maxDisk, &o.Defaults.MaxNodeDisk},
				{"--default-control-plane-memory", cpMemory, &o.Defaults.ControlPlaneMemory},
			} {
				q, err := resource.ParseQuantity(f.v)
				if err != nil {
					return usageError{errf("%s %q: %v; want a quantity such as 10Gi, or 0", f.flag, f.v, err)}
				}
				*f.to = q
			}
			for _, f := range []struct {
				flag, v string
				to      *int64
			}{{"--image-cache-size", cacheSize, &o.ImageCacheSize}, {"--image-cluster-quota", quota, &o.ImageClusterQuota}, {"--build-cache-budget", buildCacheBudget, &o.BuildCacheBudget}} {
				q, err := resource.ParseQuantity(f.v)
				if err != nil || q.Sign() < 0 {
					return usageError{errf("%s %q: want a size such as 50Gi, or 0 for none", f.flag, f.v)}
				}
				*f.to = q.Value()
			}
			logMax, err := resource.ParseQuantity(cpLogMaxSize)
			if err != nil || logMax.Sign() < 0 {
				return usageError{errf("--controlplane-log-max-size %q: want a size such as 50Mi, or 0 to never rotate", cpLogMaxSize)}
			}
			o.ControlPlaneLog.MaxSize = logMax.Value()
			if o.Upgrade, err = supervisor.ParseUpgrade(upgrade); err != nil {
				return usageError{errf("--upgrade-strategy: %v", err)}
			}
			switch onExit {
			case "stop", "keep":
				o.KeepControlPlanes = onExit == "keep"
			default:
				return usageError{errf("--control-planes-on-exit %q: want stop or keep", onExit)}
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return usageError{errf("--log-level %q: want debug, info, warn or error", logLevel)}
			}
			o.StateDir = g.stateDir
			if gogc != "" {
				o.ControlPlaneEnv = append(o.ControlPlaneEnv, "GOGC="+gogc)
			}
			log := newLogger(os.Stderr, level)
			// The in-process Kubernetes controllers (cloud controller, informers) log
			// through klog; send them into the same structured stream.
			klog.SetSlogLogger(log.With("component", "klog"))
			return daemon.Run(cmd.Context(), o, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Datastore, "datastore", "sqlite", `"sqlite" (a file per control plane) or postgres://user:password@host:port/db (a database per control plane)`)
	f.IntVar(&o.APIPort, "api-port", 7443, "loopback port of the management API")
	f.StringVar(&o.PortRange, "port-range", "7500-7599", "loopback ports leased to tenant apiservers, LOW-HIGH")
	f.StringVar(&o.NetworkRange, "network-range", "1-190", "node network indexes leased to clusters (cluster i gets 10.250.i.0/24 and pods 10.i.0.0/16); 191-199 are left for tests")
	f.BoolVar(&o.NodeNetwork, "node-network", true, "create each cluster's bridge, NAT and isolation rules (needs root); false keeps clusters loopback-only, without nodes")
	f.StringVar(&o.Egress, "egress", "internet", "where nodes' forwarded traffic may go: internet (the public internet; link-local such as the cloud metadata address, RFC 1918, CGNAT, loopback, multicast, reserved and the host's own networks walled off) or none (nothing but --egress-allow). Either way a node opens on the host only its cluster's apiserver, the registry and DNS, on its gateway")
	f.StringSliceVar(&o.EgressAllow, "egress-allow", nil, "IPv4 CIDRs nodes may reach though walled off (or under --egress none), comma-separated, e.g. an internal registry 192.168.5.0/24; empty opens none")
	f.StringSliceVar(&o.GatewayTCPAllow, "gateway-tcp-allow", nil, "TCP ports on each cluster's gateway that nodes may reach besides the apiserver, registry and DNS, comma-separated: a service the operator runs on the host for its nodes (a git server, a cache), open to every tenant's nodes; empty opens none")
	f.StringSliceVar(&o.EgressDeny, "egress-deny", nil, "IPv4 CIDRs nodes may not reach, comma-separated; wins over --egress-allow; empty closes no more")
	f.StringSliceVar(&o.RegistryMirrors, "registry-mirror", nil, "REGISTRY=URL pairs, comma-separated: fetch images of REGISTRY from URL (http(s)://host[:port]) instead of the registry itself, e.g. docker.io=https://mirror.example; a mirror may be on a private address, a registry a node names may not; empty uses none")
	f.StringSliceVar(&o.RegistryCAs, "registry-ca", nil, "PEM CA bundle files trusted for upstream registries and mirrors besides the host's roots, comma-separated; empty adds none")
	f.StringSliceVar(&o.RegistryAllow, "registry-allow", nil, "the only registries the host fetches images from for nodes (a host such as quay.io or registry.example:5000, or *.example.com), comma-separated; empty allows every registry")
	f.StringSliceVar(&o.RegistryDeny, "registry-deny", nil, "registries the host never fetches images from for nodes (same forms as --registry-allow), comma-separated; wins over --registry-allow; empty denies none")
	f.DurationVar(&o.RegistryTagTTL, "registry-tag-ttl", registry.DefaultTagTTL, "how long a tag pulled from upstream is served before upstream is asked whether it moved (a digest is never asked again; a tag pushed with `socialweb image push` is never replaced)")
	f.StringVar(&cacheSize, "image-cache-size", "50Gi", "budget of the host registry's blobs: every 5m the images pulled through that nodes used least recently are removed until it holds (never a pushed image, nor one used in the last 10m); 0 is no budget (only blobs nothing references are removed)")
	f.StringVar(&quota, "image-cluster-quota", "10Gi", "bytes a cluster may bring into the host registry (images fetched from upstream for its nodes, shared ones included, and pushed for it alone), counted until they leave it; past it its nodes get only images already stored; 0 is no quota")
	f.BoolVar(&o.BuildCache, "build-cache", true, "serve each cluster an S3 build cache (GitLab Runner's [runners.cache]) on its gateway, port "+strconv.Itoa(nodeservice.BuildCachePort)+", one bucket and one key per cluster, under <state-dir>/buildcache; `cluster runner-credential` writes it into the runner's template; false serves none (and its template gets none)")
	f.StringVar(&buildCacheBudget, "build-cache-budget", "5Gi", "bytes of objects each cluster's build cache keeps: past it, the least recently used go; 0 is the default, 5Gi")
	f.BoolVar(&o.RegistryOffline, "registry-offline", false, "fetch from no upstream registry: nodes get only images pushed with `socialweb image push`")
	f.StringVar(&o.NodeImage, "node-image", "", `node image directory (the "dir" that `+"`socialweb image build`"+` prints); empty keeps clusters at zero nodes`)
	f.DurationVar(&o.NodeBootTimeout, "node-boot-timeout", 5*time.Minute, "how long a node VM may take to register its Node before it is reported on the Cluster and deleted; a registered node not yet Ready counts as capacity for as long")
	f.StringVar(&o.Accel, "accel", "auto", "node accelerator: auto (KVM if a guest of the node image boots under it, checked once per host boot, else TCG), kvm (refused at start where no guest boots under it) or tcg")
	f.Int64Var(&o.TCGCacheMiB, "tcg-cache-mib", 1024, "TCG translation cache of each node VM in MiB (qemu's tb-size), 32-1024; most of a TCG VMM's own memory is this cache, and a node's start needs about 600 MiB of it (less and qemu flushes it mid-start, throwing away what a warm-pool VM translated beforehand); 0 is qemu's default, 1024")
	f.IntVar(&o.VMUIDBase, "vm-uid-base", qemu.DefaultVMUIDBase, "first of the users (and groups) node VMs' qemu processes run as, one per VM, up to 65536 of them: qemu opens its disks, tap and accelerator as root, then drops to its own user, so an escape from a guest owns nothing else on the host; no passwd entry is needed; keep the range clear of the host's users; 0 keeps qemu root")
	f.BoolVar(&o.TCGGuestASLR, "tcg-guest-aslr", false, "keep address space randomization in TCG node VMs; false boots them with norandmaps, because qemu's TCG keys what it translated by guest virtual address and randomized maps make every process translate its libraries again (about 0.5-1.5 s of a warm start's vCPU, docs/benchmarks.md); unused under KVM, where guests keep ASLR")
	f.BoolVar(&o.SharedLayers, "shared-layers", true, "unpack every image layer of the host registry once, on the host (<state-dir>/layers), and give each node VM those layers read-only through virtio-fs (tag "+layershare.Tag+", one virtiofsd per VM); false: nodes pull and unpack every layer themselves")
	f.IntVar(&o.WarmPool, "warm-pool", 0, "node VMs kept booted for no cluster, 0-16: a node of the default size (--default-node-cpus, --default-node-memory, --default-node-disk) is then taken from this pool, already booted, instead of booting; each holds its memory all the time and waits at nice 10, below nodes; 0 keeps none")
	f.BoolVar(&o.WarmPoolPrewarm, "warm-pool-prewarm", true, "have each warm-pool VM run, while it waits, the programs a Pod's start runs (runc, its shim, the CNI plugins), one throwaway sandbox network and container, and a standalone kubelet with one throwaway Pod (about 15 s of the VM's vCPU under TCG; warm starts about 1.2-1.7x faster, docs/benchmarks.md); false leaves pool VMs idle")
	f.DurationVar(&o.WarmPoolRefillDelay, "warm-pool-refill-delay", daemon.DefaultWarmPoolRefillDelay, "how long after a node claims a warm-pool VM its replacement starts to boot, 0-1h: under TCG a pool VM's boot and prewarm take CPU that the claimed nodes' starts also need (five claims at once on a 2-core TCG host showed no difference between 30s and 10m, docs/benchmarks.md); 0 boots the replacement at once")
	f.StringVar(&o.MetricsAddress, "metrics-address", "127.0.0.1:7080", `Prometheus /metrics listen address ("" disables)`)
	f.StringVar(&o.FrontDoor, "front-door", "", `HOST:PORT of one TLS listener that carries every tenant, routed by SNI NAME.<--front-door-domain> and passed through (the door holds no tenant key); kubeconfigs then name it; "" (off) leaves each tenant on its own loopback port only`)
	f.StringVar(&o.FrontDoorDomain, "front-door-domain", frontdoor.DefaultDomain, "DNS domain of cluster names, with or without the front door: cluster NAME is NAME.DOMAIN, which its serving certificate includes and its kubeconfigs send as TLS server name")
	f.StringVar(&o.ServiceAddress, "service-address", "", `HOST:PORT kubeconfigs and runner credentials name instead of this host's --front-door: a DNS name that resolves to every host's door, so they survive a cluster moving between hosts; "" names this host's door`)
	f.IntVar(&o.FrontDoorMaxConnsPerSource, "front-door-max-conns-per-source", frontdoor.DefaultMaxConnsPerSource, "connections the front door carries at once from one source (an IPv4 address, or an IPv6 /64), 1 to --front-door-max-conns; one more is closed as it is accepted")
	f.IntVar(&o.FrontDoorMaxConns, "front-door-max-conns", frontdoor.DefaultMaxConns, fmt.Sprintf("connections the front door carries at once from everyone, 1-%d; one more is closed as it is accepted", frontdoor.MaxMaxConns))
	f.Int32Var(&o.Defaults.MaxNodes, "default-max-nodes", 5, "max worker nodes of a cluster that does not say")
	f.DurationVar(&o.Defaults.Hold, "default-hold", time.Minute, "idle time before a node is removed, for a cluster that does not say")
	f.Int32Var(&o.Defaults.NodeCPUs, "default-node-cpus", 1, "vCPUs of the smallest worker node, for a cluster that does not say")
	f.Int32Var(&o.Defaults.MaxNodeCPUs, "default-max-node-cpus", 0, "vCPUs of the largest worker node, for a cluster that does not say; 0 is --default-node-cpus (a fixed size)")
	f.StringVar(&memory, "default-node-memory", "1Gi", "memory of the smallest worker node, for a cluster that does not say")
	f.StringVar(&maxMemory, "default-max-node-memory", "0", "memory of the largest worker node, for a cluster that does not say; 0 is --default-node-memory (a fixed size)")
	f.StringVar(&disk, "default-node-disk", "10Gi", "container-storage disk of the smallest worker node (a sparse file: host disk is used as it fills), for a cluster that does not say; 0 gives nodes none")
	f.StringVar(&maxDisk, "default-max-node-disk", "0", "container-storage disk of the largest worker node, for Pods that request ephemeral storage, for a cluster that does not say; 0 is --default-node-disk")
	f.Int32Var(&o.Defaults.PodsPerNode, "default-pods-per-node", 110, "max pods per worker node, for a cluster that does not say")
	f.DurationVar(&o.Defaults.SleepAfter, "default-sleep-after", 0, "idle time (no API request from outside socialweb, no node, none wanted, no CronJob due) before a cluster's control plane sleeps, for a cluster that does not say; 0 is never, else at least 30s")
	f.StringVar(&cpMemory, "default-control-plane-memory", "2Gi", "memory cap of a cluster's control-plane process (its own cgroup: past it the kernel kills that process alone, and it is restarted), for a cluster that does not say; at least "+v1.MinControlPlaneMemory+", or 0 for none; an idle one holds about 300Mi")
	f.Int32Var(&o.Defaults.ControlPlanePIDs, "default-control-plane-pids", 4096, fmt.Sprintf("cap on a control plane's threads and processes (pids.max), for a cluster that does not say; at least %d", v1.MinControlPlanePIDs))
	f.Int32Var(&o.Defaults.ControlPlaneCPUWeight, "default-control-plane-cpu-weight", 100, "CPU share of a control plane against other tenants (cpu.weight, 1-10000; 100 is an ordinary process), for a cluster that does not say")
	f.StringVar(&o.CgroupParent, "cgroup-parent", daemon.DefaultCgroupParent, `cgroup (under /sys/fs/cgroup, v2 or v1) each control plane gets a group of its own in, with its limits; "" runs control planes unlimited; where the host gives none, the default serves without limits and says so, another value refuses to start`)
	f.StringVar(&gogc, "controlplane-gogc", "50", `GOGC of each control-plane process ("" leaves Go's default): lower trades CPU for memory`)
	f.StringVar(&cpLogMaxSize, "controlplane-log-max-size", "50Mi", "size past which a control plane's controlplane.log (in its state dir; the management API's too) is rotated: renamed controlplane.log.1, older ones shifted to .2, .3 ..., and begun anew; 0 never rotates")
	f.IntVar(&o.ControlPlaneLog.Keep, "controlplane-log-keep", 3, fmt.Sprintf("rotated control-plane logs kept (controlplane.log.1 to .N, the oldest removed), 0-%d; 0 keeps none", logrotate.MaxKeep))
	f.Int64Var(&o.ControlPlaneUIDBase, "control-plane-uid-base", tenantuid.DefaultBase, fmt.Sprintf("each tenant's control plane runs as uid and gid this plus its apiserver port, with read access to its own cluster's files only and write access to its run dir only; 0 runs them as root (as before); else at least %d, far from any user's uid (nothing in /etc/passwd is needed); every directory above --state-dir must be searchable by others (o+x)", tenantuid.MinBase))
	f.StringVar(&upgrade, "upgrade-strategy", string(supervisor.UpgradeRolling), "what a new daemon does with a control plane an earlier daemon left running on another build or configuration: rolling (replaced one tenant at a time, each once the one before serves, on the socket the daemon holds, so clients wait and are never refused; a new build that fails stops the rollout), on-restart (all replaced at once, as the daemon starts), manual (kept until each next restarts for another reason)")
	f.StringVar(&o.BuiltinImages, "builtin-images", "", "a directory holding the built-in images (pause.tar, busybox.tar, as `socialweb image builtin --out DIR` writes them; the package ships them in /usr/lib/socialweb/images), loaded into the registry at start; empty builds them, which needs the Go toolchain and Debian's mirror")
	f.StringVar(&onExit, "control-planes-on-exit", "stop", "what the control planes (the management API's too) do when the daemon stops: stop, or keep serving for the next serve to adopt (no tenant outage across a restart or upgrade; socialweb down stops them). A daemon killed or crashed always leaves them serving")
	f.StringVar(&o.HostName, "host-name", "", `this host's name in the service (its Host object and Lease; a DNS label, unique among the hosts sharing a datastore); "" is this machine's hostname`)
	f.StringVar(&o.HostAddress, "host-address", "", `the address other hosts and clients reach this host at, recorded on its Host object; "" records none`)
	f.StringVar(&o.RegistryPeerAddress, "registry-peer-address", "", fmt.Sprintf(`HOST:PORT where other hosts of the service fetch the images pushed on this host (`+"`socialweb image push`"+`; read-only, pushed images only, mutual TLS with certificates of the management API's CAs, so nodes get nothing from it), recorded on its Host object; a node's pull of an image this host lacks asks the other hosts' before upstream; 0.0.0.0:PORT listens on every interface and is reached at --host-address; "" is --host-address:%d when --host-address is set (left off, with a warning, if that address cannot be listened on), else off`, daemon.DefaultRegistryPeerPort))
	f.StringVar(&o.ClusterKeyFile, "cluster-key-file", "", `with a postgres datastore: the file holding the key (64 hex digits, mode 0600) the service's shared bootstrap (the management API's CAs and service-account key) is sealed with in the datastore; every host of a service needs the same one; "" is <state-dir>/cluster.key, made on the first start`)
	f.IntVar(&o.MaxTenants, "max-tenants", 0, "most tenants placed on this host; a host at it gets no new tenant, others do; 0 is no cap")
	f.DurationVar(&o.HostLeaseDuration, "host-lease-duration", hosts.DefaultLeaseDuration, "how long a host that stops renewing its Lease (every third of this) keeps its tenants in the other hosts' eyes; with a postgres datastore a host that could not renew for this long stops its tenants; at least "+daemon.MinHostLeaseDuration.String())
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	documentEnv(f)
	withConfigFile(cmd)
	return cmd
}
