package gitlab

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/socialweb-computer/socialweb/internal/buildcache"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Credential is a minted runner identity and where to use it.
type Credential struct {
	Grant
	Cluster string    // the tenant cluster's name, for names in the files
	Server  string    // the tenant apiserver's URL (the front door's, when there is one)
	CA      []byte    // PEM of the CA that signed the apiserver's certificate
	Token   string    // the ServiceAccount token
	Expires time.Time // when the apiserver stops accepting Token
	// ServerName is the cluster's (SNI) name: the kubeconfig sends it
	// (tls-server-name) whatever host Server names, so it is routed by the
	// front door and wakes the cluster when it sleeps. "" for none.
	ServerName string
	// Door: Server is the front door, not the cluster's own port.
	Door bool
	// Cache is the cluster's build cache on the host; nil when the host serves none.
	Cache *buildcache.Access
}

// Kubeconfig is a kubeconfig with the CA and token embedded and the runner's namespace
// as the default, so `kubectl --kubeconfig F auth can-i ...` answers for the runner.
func (c Credential) Kubeconfig() ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	ctx := c.Cluster + "-" + c.Name
	cfg.Clusters[c.Cluster] = &clientcmdapi.Cluster{Server: c.Server, TLSServerName: c.ServerName, CertificateAuthorityData: c.CA}
	cfg.AuthInfos[ctx] = &clientcmdapi.AuthInfo{Token: c.Token}
	cfg.Contexts[ctx] = &clientcmdapi.Context{Cluster: c.Cluster, AuthInfo: ctx, Namespace: c.Namespace}
	cfg.CurrentContext = ctx
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("writing the runner kubeconfig for %s: %w", c.Cluster, err)
	}
	return b, nil
}

// runnerHost is the URL the runner dials. GitLab Runner's [runners.kubernetes]
// has host, ca_file, cert_file, key_file, bearer_token and context, but no TLS
// server name, and Go sends a URL's host as SNI (never an IP address): behind
// the front door the URL must name the cluster's SNI name, at the door's port.
// On the cluster's own port it stays the loopback address, which resolves
// everywhere (the template's comment says what that costs a sleeping cluster).
func (c Credential) runnerHost() (string, error) {
	if c.ServerName == "" || !c.Door {
		return c.Server, nil
	}
	u, err := url.Parse(c.Server)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("the apiserver URL %q of %s is not a URL: %v", c.Server, c.Cluster, err)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	u.Host = net.JoinHostPort(c.ServerName, port)
	return u.String(), nil
}

// RunnerTemplate is a config.toml template for `gitlab-runner register --template-config`:
// the kubernetes executor's connection and namespace, and the job settings s with a
// comment on each saying why; without the GitLab URL and runner token, which `register`
// adds. caFile is where the CA PEM is written for the runner.
func (c Credential) RunnerTemplate(caFile string, s Settings) ([]byte, error) {
	host, err := c.runnerHost()
	if err != nil {
		return nil, err
	}
	w := &tomlWriter{}
	w.comment(0, "socialweb: kubernetes executor for cluster %s, namespace %s, as %s.\n"+
		"The token expires %s; mint another with `socialweb cluster runner-credential %s`.\n"+
		"Written for this cluster's nodes (%s each; %dm CPU and %dMi of memory schedulable):\n"+
		"run runner-credential again after changing them. GitLab Runner ignores a key it does not\n"+
		"know, so check a name against its [runners.kubernetes] documentation before adding one.",
		c.Cluster, c.Namespace, c.Username(), c.Expires.UTC().Format(time.RFC3339), c.Cluster,
		s.Node, s.SchedulableCPUMilli, s.SchedulableMemory>>20)
	w.line(0, "[[runners]]")
	w.str(1, "executor", "kubernetes")
	w.comment(1, "The runner stops collecting a job's log at output_limit KiB (its default, %d, is 4 MiB,\n"+
		"which a verbose test run exceeds); the job goes on, its log does not. %d KiB = %s (--log-limit).",
		RunnerLogLimitKiB, s.LogLimitKiB, s.LogLimit)
	w.int(1, "output_limit", s.LogLimitKiB)
	w.comment(1, "The runner prints its job Pod's events in the job log while it waits (GitLab Runner 16.5 and\n"+
		"later): socialweb tells a waiting Pod which node is booting for it, its size and about how\n"+
		"long, and why a node failed or an image cannot be pulled. Without this the log says only\n"+
		"\"no nodes available to schedule pods\" until the node is up.")
	w.line(1, "[runners.feature_flags]")
	w.line(2, "FF_PRINT_POD_EVENTS = true")
	if a := c.Cache; a != nil {
		w.comment(1, "GitLab's cache (a job's `cache:`) is socialweb's build cache for cluster %s: an S3 bucket on\n"+
			"the host that outlives each job's node. The runner presigns each archive's URL with these\n"+
			"keys, without a request of its own (BucketLocation is set), and the job's helper downloads and\n"+
			"uploads it from the job Pod, which reaches ServerAddress on its cluster's gateway; no other\n"+
			"cluster's Pods can, and these keys open this cluster's bucket alone. Shared: every runner\n"+
			"registered with this template shares it. Past the host's budget per cluster (serve\n"+
			"--build-cache-budget, 5Gi by default) the least recently used archives go. Plain HTTP: the\n"+
			"traffic stays on the cluster's own bridge, and each URL is signed.", c.Cluster)
		w.line(1, "[runners.cache]")
		w.str(2, "Type", "s3")
		w.line(2, "Shared = true")
		w.line(2, "[runners.cache.s3]")
		w.str(3, "ServerAddress", a.Endpoint)
		w.str(3, "AccessKey", a.AccessKey)
		w.str(3, "SecretKey", a.SecretKey)
		w.str(3, "BucketName", a.Bucket)
		w.str(3, "BucketLocation", "us-east-1")
		w.line(3, "Insecure = true")
	} else {
		w.comment(1, "No [runners.cache]: the host serves no build cache (serve --build-cache=false), so a job's\n"+
			"`cache:` is kept nowhere and each job starts without it.")
	}
	w.line(1, "[runners.kubernetes]")
	switch {
	case c.ServerName != "" && !c.Door:
		w.comment(2, "The cluster's own port. The runner has no setting for a TLS server name and sends none to an\n"+
			"IP address, and a sleeping cluster wakes only for a client that names it (%s): with\n"+
			"sleepAfter set, use the front door, or name %s here at this port where it resolves to\n"+
			"127.0.0.1. The kubeconfig beside this file sends the name.",
			c.ServerName, c.ServerName)
	case c.ServerName != "":
		w.comment(2, "Through the socialweb front door (%s), which routes by the TLS server name. The runner has\n"+
			"no setting for a server name apart from the URL, so host names the cluster's: the runner's\n"+
			"machine must resolve %s to the door (a wildcard DNS record for its domain, or a\n"+
			"line in /etc/hosts). The kubeconfig beside this file names the door's address instead.",
			c.Server, c.ServerName)
	}
	w.str(2, "host", host)
	w.str(2, "ca_file", caFile)
	w.str(2, "bearer_token", c.Token)
	w.str(2, "namespace", c.Namespace)

	w.comment(2, "Seconds the runner waits for a job Pod to run. This cluster starts at zero nodes, so that\n"+
		"includes a node boot: up to the daemon's --node-boot-timeout (%s by default; the Cluster\n"+
		"does not say, so that default is the floor here), then %s to pull the job's images.\n"+
		"Measured under TCG: 78-104 s for one new node, 227-236 s for four at once; the runner's\n"+
		"default of %d s fails jobs that start together (--poll-timeout).",
		NodeBootDeadline, PullAllowance, int64(RunnerPollTimeout/time.Second))
	w.int(2, "poll_timeout", int64(s.PollTimeout/time.Second))
	w.comment(2, "Seconds between the runner's looks at a waiting Pod: a node boot takes tens of seconds,\n"+
		"so this costs a job little and keeps the tenant apiserver quiet (--poll-interval).")
	w.int(2, "poll_interval", int64(s.PollInterval/time.Second))
	w.comment(2, "Nodes pull from the host registry; if-not-present reuses an image a node already has\n"+
		"instead of asking the registry again for every job.")
	w.str(2, "pull_policy", "if-not-present")
	if s.PrivilegedJobs {
		w.comment(2, "Job containers run privileged (--privileged-jobs), e.g. for docker-in-docker. Root in the\n"+
			"job is root in its node microVM: it may see the node's other Pods and credentials, but\n"+
			"not the host or another cluster. The namespace enforces Pod Security \"privileged\".")
		w.line(2, "privileged = true")
	} else {
		w.comment(2, "Job Pods are held to Pod Security \"baseline\" (no privileged containers, host namespaces\n"+
			"or hostPath): --privileged-jobs allows docker-in-docker.")
	}

	w.comment(2, "Requests, not limits. The scheduler and socialweb's scale decision place a Pod by its\n"+
		"requests, so these decide how many nodes boot and how jobs share them. A container with\n"+
		"a limit and no request is given the limit as its request: helper_cpu_limit = 1 alone made\n"+
		"each job Pod ask for about 2.1 CPU, which a 2-vCPU node refused. No limits are set, so a\n"+
		"job may use all of its node; if you add a limit, keep the request beside it.\n"+
		"%s\n"+
		"CPU: %s = %dm of the node's %dm.\n"+
		"Memory: %s = %dMi of the node's %dMi.",
		s.sizedFor(),
		s.sum(s.BuildCPU, s.HelperCPU, s.ServiceCPU), int64(s.JobsPerNode)*s.PodCPUMilli, s.SchedulableCPUMilli,
		s.sum(s.BuildMemory, s.HelperMemory, s.ServiceMemory), ceilMi(int64(s.JobsPerNode)*s.PodMemory), s.SchedulableMemory>>20)
	switch {
	case s.DerivedCPU && s.DerivedMemory:
		w.comment(2, "The build requests are the node's share less the helper and services (--job-cpu, --job-memory).")
	case s.DerivedCPU:
		w.comment(2, "The build CPU request is the node's share less the helper and services (--job-cpu).")
	case s.DerivedMemory:
		w.comment(2, "The build memory request is the node's share less the helper and services (--job-memory).")
	}
	w.str(2, "cpu_request", s.BuildCPU.String())
	w.str(2, "memory_request", s.BuildMemory.String())
	w.str(2, "helper_cpu_request", s.HelperCPU.String())
	w.str(2, "helper_memory_request", s.HelperMemory.String())
	if s.ServicesPerJob > 0 {
		w.comment(2, "Each service container asks for these, so a job with more services than planned above\n"+
			"may fit no node (--services-per-job, --service-cpu, --service-memory).")
		w.str(2, "service_cpu_request", s.ServiceCPU.String())
		w.str(2, "service_memory_request", s.ServiceMemory.String())
	} else {
		w.comment(2, "Services get no request (--services-per-job 0): they never keep a job Pod off a node,\n"+
			"and they are the first to go when a node runs out of memory.")
	}
	if s.HelperImage != "" {
		w.comment(2, "The helper (clone, artifacts, cache) runs this image, pulled through the host's\n"+
			"registry cache like a job's image (--helper-image).")
		w.str(2, "helper_image", s.HelperImage)
	} else {
		w.comment(2, "helper_image is not set: the runner uses registry.gitlab.com/gitlab-org/gitlab-runner/\n"+
			"gitlab-runner-helper:x86_64-v<its version>, pulled through the host's registry cache (the\n"+
			"operator's --registry-allow must not exclude registry.gitlab.com); --helper-image names another.")
	}
	if s.OneJobPerNode {
		const term = "[runners.kubernetes.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution"
		w.comment(2, "One job per node (--one-job-per-node): every job Pod carries %s, and no two Pods\n"+
			"with it may share a node (kubernetes.io/hostname), so each job gets a node of its own and the\n"+
			"scale decision boots one per waiting job, up to the cluster's --max-nodes.", JobLabel)
		w.line(2, "[runners.kubernetes.pod_labels]")
		w.str(3, JobLabel, "true")
		w.line(2, "[runners.kubernetes.affinity]")
		w.line(3, "[runners.kubernetes.affinity.pod_anti_affinity]")
		w.line(4, "["+term+"]]")
		w.str(5, "topology_key", "kubernetes.io/hostname")
		w.line(5, term+".label_selector]")
		w.line(6, "["+term+".label_selector.match_expressions]]")
		w.str(7, "key", JobLabel)
		w.str(7, "operator", "Exists")
	}
	if w.err != nil {
		return nil, fmt.Errorf("runner config template: %w", w.err)
	}
	// A template GitLab Runner cannot parse fails at register time, far from here.
	var doc map[string]any
	if _, err := toml.Decode(w.b.String(), &doc); err != nil {
		return nil, fmt.Errorf("runner config template does not parse as TOML: %w", err)
	}
	return []byte(w.b.String()), nil
}

// tomlWriter writes indented TOML with comments; the first bad value is kept in err.
type tomlWriter struct {
	b   strings.Builder
	err error
}

func (w *tomlWriter) line(depth int, s string) {
	w.b.WriteString(strings.Repeat("  ", depth))
	w.b.WriteString(s)
	w.b.WriteByte('\n')
}

// comment writes each line of the formatted text as a comment.
func (w *tomlWriter) comment(depth int, format string, args ...any) {
	for _, l := range strings.Split(fmt.Sprintf(format, args...), "\n") {
		w.line(depth, "# "+l)
	}
}

// key quotes k unless it is a bare TOML key.
func (w *tomlWriter) key(k string) string {
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			q, err := tomlString(k)
			if err != nil && w.err == nil {
				w.err = fmt.Errorf("key %w", err)
			}
			return q
		}
	}
	return k
}

func (w *tomlWriter) str(depth int, k, v string) {
	q, err := tomlString(v)
	if err != nil && w.err == nil {
		w.err = fmt.Errorf("%s: %w", k, err)
	}
	w.line(depth, w.key(k)+" = "+q)
}

func (w *tomlWriter) int(depth int, k string, v int64) {
	w.line(depth, w.key(k)+" = "+strconv.FormatInt(v, 10))
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
