package gitlab

import (
	"fmt"
	"strings"
	"time"

	"github.com/distribution/reference"
	"k8s.io/apimachinery/pkg/api/resource"
)

// What a job Pod waits for on a cluster that starts at zero nodes, and the bounds of the
// settings an operator may change.
const (
	// NodeBootDeadline is the daemon's default --node-boot-timeout: a node that has not
	// registered by then is deleted. The Cluster object does not carry the daemon's
	// value, so this documented default is the floor of poll_timeout.
	NodeBootDeadline = 5 * time.Minute
	// PullAllowance is the time allowed for a job's images to come from the host
	// registry once its node is up: a large toolchain image takes minutes under TCG.
	PullAllowance = 5 * time.Minute
	// DefaultPollTimeout is how long the runner waits for a job Pod to run.
	DefaultPollTimeout = NodeBootDeadline + PullAllowance
	// MaxPollTimeout: longer than a day is a job that waits for capacity that is not coming.
	MaxPollTimeout = 24 * time.Hour
	// RunnerPollTimeout is GitLab Runner's own default, too short for a node boot.
	RunnerPollTimeout = 180 * time.Second

	DefaultPollInterval = 5 * time.Second
	MinPollInterval     = time.Second
	MaxPollInterval     = time.Minute

	// DefaultLogLimit: the seed's verbose test run outgrew the runner's 4 MiB; 50Mi stays
	// under GitLab's own default trace limit (100 MB), so GitLab remains the outer bound.
	DefaultLogLimit = "50Mi"
	// RunnerLogLimitKiB is GitLab Runner's own output_limit default.
	RunnerLogLimitKiB = 4096
	minLogLimit       = 1 << 20
	maxLogLimit       = 1 << 30

	// The helper clones and uploads artifacts; a service is a sidecar such as a database.
	// Small requests: they place the Pod, they do not cap it.
	DefaultHelperCPU     = "100m"
	DefaultHelperMemory  = "128Mi"
	DefaultServiceCPU    = "100m"
	DefaultServiceMemory = "128Mi"

	DefaultServicesPerJob = 1
	MaxServicesPerJob     = 8
	DefaultJobsPerNode    = 1
	MaxJobsPerNode        = 64

	// JobLabel is put on every job Pod with --one-job-per-node, and its anti-affinity
	// repels other Pods carrying it. A label of our own, not one of the runner's, so
	// nothing but this runner's job Pods matches.
	JobLabel = "socialweb.computer/ci-job"
)

// The smallest request of any container: a CPU request below a millicore is rounded to
// nothing, and a container with less than 4Mi does not start.
const (
	minCPUMilli = 1
	minMemory   = 4 << 20
)

// JobOptions are the job settings an operator may change (flags of `cluster
// runner-credential`). Quantities are Kubernetes quantities as typed.
type JobOptions struct {
	JobCPU, JobMemory         string // build container requests; "": the node's share per job
	HelperCPU, HelperMemory   string
	ServiceCPU, ServiceMemory string // per service container
	ServicesPerJob            int    // services a job Pod is sized for; 0: services get no request
	JobsPerNode               int    // job Pods planned per node, when the build requests are derived
	OneJobPerNode             bool   // required anti-affinity between job Pods on kubernetes.io/hostname
	PollTimeout               time.Duration
	PollInterval              time.Duration
	LogLimit                  string // output_limit as a quantity of bytes
	HelperImage               string // "": the runner's own default helper image
	// PrivilegedJobs runs job containers privileged (docker-in-docker); the
	// namespace must allow it (Grant.PrivilegedJobs).
	PrivilegedJobs bool
}

// DefaultJobOptions are what a CI admin gets without saying otherwise.
func DefaultJobOptions() JobOptions {
	return JobOptions{
		HelperCPU: DefaultHelperCPU, HelperMemory: DefaultHelperMemory,
		ServiceCPU: DefaultServiceCPU, ServiceMemory: DefaultServiceMemory,
		ServicesPerJob: DefaultServicesPerJob, JobsPerNode: DefaultJobsPerNode,
		PollTimeout: DefaultPollTimeout, PollInterval: DefaultPollInterval,
		LogLimit: DefaultLogLimit,
	}
}

// NodeSize is the shape of every worker node of a cluster (its Cluster spec).
type NodeSize struct {
	CPUs    int64
	Memory  resource.Quantity
	MaxPods int
	// MaxCPUs and MaxMemory are the largest node the cluster may boot (sized by the
	// requests of the Pods it is for); 0 is CPUs's and Memory's (every node the same).
	MaxCPUs   int64
	MaxMemory resource.Quantity
}

// Largest is the biggest node the cluster may boot.
func (n NodeSize) Largest() NodeSize {
	l := NodeSize{CPUs: max(n.CPUs, n.MaxCPUs), Memory: n.Memory, MaxPods: n.MaxPods}
	if n.MaxMemory.Cmp(n.Memory) > 0 {
		l.Memory = n.MaxMemory
	}
	return l
}

// MemoryReserve is the part of a node's memory no Pod can be given: the guest kernel
// keeps some of the VM's memory for itself (its image and page tables, about 3% + 20 MiB
// for Debian's cloud kernel; estimated, not measured per node) and the kubelet keeps
// its eviction threshold (memory.available 100Mi) out of allocatable. 128Mi + 1/16 of
// the node covers both with margin.
func MemoryReserve(nodeMemory int64) int64 {
	return 128<<20 + nodeMemory/16
}

// Schedulable is what the scheduler can place on one node: every vCPU (nodes run no
// system Pods: kube-proxy and cluster DNS live in the node agent) and the memory less
// MemoryReserve.
func (n NodeSize) Schedulable() (cpuMilli, memory int64) {
	m := n.Memory.Value()
	return n.CPUs * 1000, m - MemoryReserve(m)
}

func (n NodeSize) String() string {
	return fmt.Sprintf("%d vCPU and %s", n.CPUs, n.Memory.String())
}

// Settings are JobOptions resolved for a cluster's nodes: what the template writes. Its
// quantities, parsed, stand in for the option strings of the same names.
type Settings struct {
	JobOptions
	Node                                   NodeSize
	BuildCPU, BuildMemory                  resource.Quantity
	HelperCPU, HelperMemory                resource.Quantity
	ServiceCPU, ServiceMemory              resource.Quantity
	DerivedCPU, DerivedMemory              bool // build requests are the node's share
	LogLimitKiB                            int64
	PodCPUMilli, PodMemory                 int64 // one job Pod with ServicesPerJob services
	SchedulableCPUMilli, SchedulableMemory int64 // of one node
}

// parsed is JobOptions with its quantities read.
type parsed struct {
	jobCPU, jobMemory         *resource.Quantity // nil: derived
	helperCPU, helperMemory   resource.Quantity
	serviceCPU, serviceMemory resource.Quantity
	logLimit                  int64
}

// Validate says what is wrong with o on its own, and what would be accepted. It needs
// no cluster, so it runs before anything is asked of one.
func (o JobOptions) Validate() error {
	_, problems := o.parse()
	return asError(problems)
}

func (o JobOptions) parse() (parsed, []string) {
	var p parsed
	var problems []string
	cpu := func(flag, s string) resource.Quantity {
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() <= 0 || q.MilliValue() < minCPUMilli {
			problems = append(problems, fmt.Sprintf("--%s %q is not a CPU request: give cores (2) or millicores (500m), at least 1m", flag, s))
		}
		return q
	}
	mem := func(flag, s string) resource.Quantity {
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Value() < minMemory {
			problems = append(problems, fmt.Sprintf("--%s %q is not a memory request: give bytes with a unit (512Mi, 2Gi), at least 4Mi", flag, s))
		}
		return q
	}
	if o.JobCPU != "" {
		q := cpu("job-cpu", o.JobCPU)
		p.jobCPU = &q
	}
	if o.JobMemory != "" {
		q := mem("job-memory", o.JobMemory)
		p.jobMemory = &q
	}
	p.helperCPU = cpu("helper-cpu", o.HelperCPU)
	p.helperMemory = mem("helper-memory", o.HelperMemory)
	p.serviceCPU = cpu("service-cpu", o.ServiceCPU)
	p.serviceMemory = mem("service-memory", o.ServiceMemory)
	if o.ServicesPerJob < 0 || o.ServicesPerJob > MaxServicesPerJob {
		problems = append(problems, fmt.Sprintf("--services-per-job %d is outside 0..%d", o.ServicesPerJob, MaxServicesPerJob))
	}
	if o.JobsPerNode < 1 || o.JobsPerNode > MaxJobsPerNode {
		problems = append(problems, fmt.Sprintf("--jobs-per-node %d is outside 1..%d", o.JobsPerNode, MaxJobsPerNode))
	}
	if o.OneJobPerNode && o.JobsPerNode > 1 {
		problems = append(problems, fmt.Sprintf("--one-job-per-node and --jobs-per-node %d contradict each other: drop one", o.JobsPerNode))
	}
	switch {
	case o.PollTimeout < NodeBootDeadline:
		problems = append(problems, fmt.Sprintf("--poll-timeout %s is shorter than a node boot may take (the daemon's --node-boot-timeout, %s by default): give %s..%s (the default, %s, also allows %s for pulling images)",
			o.PollTimeout, NodeBootDeadline, NodeBootDeadline, MaxPollTimeout, DefaultPollTimeout, PullAllowance))
	case o.PollTimeout > MaxPollTimeout:
		problems = append(problems, fmt.Sprintf("--poll-timeout %s is longer than %s: a job would wait that long for capacity that is not coming", o.PollTimeout, MaxPollTimeout))
	case o.PollTimeout%time.Second != 0:
		problems = append(problems, fmt.Sprintf("--poll-timeout %s: the runner counts whole seconds, e.g. %s", o.PollTimeout, o.PollTimeout.Round(time.Second)))
	}
	switch {
	case o.PollInterval < MinPollInterval || o.PollInterval > MaxPollInterval:
		problems = append(problems, fmt.Sprintf("--poll-interval %s is outside %s..%s", o.PollInterval, MinPollInterval, MaxPollInterval))
	case o.PollInterval%time.Second != 0:
		problems = append(problems, fmt.Sprintf("--poll-interval %s: the runner counts whole seconds, e.g. %s", o.PollInterval, o.PollInterval.Round(time.Second)))
	}
	if q, err := resource.ParseQuantity(o.LogLimit); err != nil || q.Value() < minLogLimit || q.Value() > maxLogLimit || q.Value()%1024 != 0 {
		problems = append(problems, fmt.Sprintf("--log-limit %q: give a size in whole KiB from 1Mi to 1Gi, e.g. %s (the runner's own default is 4Mi)", o.LogLimit, DefaultLogLimit))
	} else {
		p.logLimit = q.Value()
	}
	if o.HelperImage != "" {
		if err := checkImage(o.HelperImage); err != nil {
			problems = append(problems, fmt.Sprintf("--helper-image %q is not an image reference (%v): e.g. registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper:x86_64-v${CI_RUNNER_VERSION}", o.HelperImage, err))
		}
	}
	return p, problems
}

// checkImage parses ref as an image reference once the runner's own variables in it
// (documented for helper_image) are given sample values.
func checkImage(ref string) error {
	r := strings.NewReplacer("${CI_RUNNER_VERSION}", "17.0.0", "$CI_RUNNER_VERSION", "17.0.0",
		"${CI_RUNNER_REVISION}", "0123abcd", "$CI_RUNNER_REVISION", "0123abcd")
	_, err := reference.ParseNormalizedNamed(r.Replace(ref))
	return err
}

// ForNode resolves o for a cluster whose nodes are n, and refuses what no node of it
// could ever run: a job Pod that asks for more than a node has stays Pending forever
// while nodes boot and leave around it.
func (o JobOptions) ForNode(cluster string, n NodeSize) (Settings, error) {
	p, problems := o.parse()
	if len(problems) > 0 {
		return Settings{}, asError(problems)
	}
	if n.CPUs < 1 || n.Memory.Sign() <= 0 {
		return Settings{}, fmt.Errorf("runner credential: cluster %s has no node size yet (%s): wait until it is Ready (`socialweb cluster get %s`)", cluster, n, cluster)
	}
	s := Settings{
		JobOptions: o, Node: n,
		HelperCPU: p.helperCPU, HelperMemory: p.helperMemory,
		ServiceCPU: p.serviceCPU, ServiceMemory: p.serviceMemory,
		LogLimitKiB: p.logLimit / 1024,
	}
	s.SchedulableCPUMilli, s.SchedulableMemory = n.Schedulable()
	// Derived requests fill the smallest node (jobs pack onto it); what was asked for may
	// be as large as the largest node, which the scale decision boots for such a Pod.
	big := n.Largest()
	limCPU, limMem := big.Schedulable()
	jobs := int64(o.JobsPerNode)
	svc := int64(o.ServicesPerJob)
	// What one job Pod asks for besides its build container.
	sideCPU := p.helperCPU.MilliValue() + svc*p.serviceCPU.MilliValue()
	sideMem := p.helperMemory.Value() + svc*p.serviceMemory.Value()
	if n.MaxPods > 0 && o.JobsPerNode > n.MaxPods {
		problems = append(problems, fmt.Sprintf("--jobs-per-node %d is more than the %d Pods a node of cluster %s takes", o.JobsPerNode, n.MaxPods, cluster))
	}
	if p.jobCPU != nil {
		s.BuildCPU = *p.jobCPU
	} else {
		s.DerivedCPU = true
		s.BuildCPU = *resource.NewMilliQuantity(s.SchedulableCPUMilli/jobs-sideCPU, resource.DecimalSI)
	}
	if p.jobMemory != nil {
		s.BuildMemory = *p.jobMemory
	} else {
		s.DerivedMemory = true
		share := (s.SchedulableMemory/jobs - sideMem) >> 20 << 20 // whole MiB
		s.BuildMemory = *resource.NewQuantity(share, resource.BinarySI)
	}
	s.PodCPUMilli = s.BuildCPU.MilliValue() + sideCPU
	s.PodMemory = s.BuildMemory.Value() + sideMem
	per := "a job Pod asks for"
	if jobs > 1 {
		per = fmt.Sprintf("%d job Pods per node (--jobs-per-node) ask for", jobs)
	}
	services := fmt.Sprintf("%d service(s) × ", o.ServicesPerJob)
	switch {
	case s.DerivedCPU && s.BuildCPU.MilliValue() < minCPUMilli:
		problems = append(problems, fmt.Sprintf("a node of cluster %s has %dm CPU; split %d way(s), it leaves nothing for the build container after the helper's %s and %s%s: lower --helper-cpu, --service-cpu, --services-per-job or --jobs-per-node, or give the cluster bigger nodes (`cluster create --node-cpus`)",
			cluster, s.SchedulableCPUMilli, jobs, p.helperCPU.String(), services, p.serviceCPU.String()))
	case jobs*s.PodCPUMilli > limCPU:
		problems = append(problems, fmt.Sprintf("%s %dm CPU (build %s + helper %s + %s%s each) and the largest node of cluster %s has %dm: --job-cpu may be at most %dm with these, or give the cluster bigger nodes (`cluster create --max-node-cpus`)",
			per, jobs*s.PodCPUMilli, s.BuildCPU.String(), p.helperCPU.String(), services, p.serviceCPU.String(), cluster, limCPU, max(0, limCPU/jobs-sideCPU)))
	}
	switch {
	case s.DerivedMemory && s.BuildMemory.Value() < minMemory:
		problems = append(problems, fmt.Sprintf("a node of cluster %s has %dMi of memory Pods may ask for (%s less %dMi the guest kernel and the kubelet keep); split %d way(s), it leaves less than 4Mi for the build container after the helper's %s and %s%s: lower --helper-memory, --service-memory, --services-per-job or --jobs-per-node, or give the cluster bigger nodes (`cluster create --node-memory`)",
			cluster, s.SchedulableMemory>>20, n.Memory.String(), MemoryReserve(n.Memory.Value())>>20, jobs, p.helperMemory.String(), services, p.serviceMemory.String()))
	case jobs*s.PodMemory > limMem:
		problems = append(problems, fmt.Sprintf("%s %dMi of memory (build %s + helper %s + %s%s each) and the largest node of cluster %s has %dMi Pods may ask for (%s less %dMi the guest kernel and the kubelet keep): --job-memory may be at most %dMi with these, or give the cluster bigger nodes (`cluster create --max-node-memory`)",
			per, ceilMi(jobs*s.PodMemory), s.BuildMemory.String(), p.helperMemory.String(), services, p.serviceMemory.String(), cluster, limMem>>20, big.Memory.String(), MemoryReserve(big.Memory.Value())>>20, max(0, (limMem/jobs-sideMem)>>20)))
	}
	if len(problems) > 0 {
		return Settings{}, asError(problems)
	}
	return s, nil
}

// ceilMi is b in MiB, rounded up: an amount asked for is never shown smaller than it is.
func ceilMi(b int64) int64 { return (b + 1<<20 - 1) >> 20 }

// sizedFor says in words what a node is planned to hold.
func (s Settings) sizedFor() string {
	svc := "with up to one service"
	switch s.ServicesPerJob {
	case 0:
		svc = "its services not counted"
	case 1:
	default:
		svc = fmt.Sprintf("with up to %d services", s.ServicesPerJob)
	}
	if s.JobsPerNode > 1 {
		return fmt.Sprintf("Sized for %d job Pods per node, %s:", s.JobsPerNode, svc)
	}
	if s.DerivedCPU || s.DerivedMemory {
		return "Sized for one job Pod per node, " + svc + ":"
	}
	fit := min(s.SchedulableCPUMilli/s.PodCPUMilli, s.SchedulableMemory/s.PodMemory)
	if s.OneJobPerNode {
		return fmt.Sprintf("A job Pod, %s, asks for the sums below; %d would fit a node, one is let on it:", svc, fit)
	}
	return fmt.Sprintf("A job Pod, %s, asks for the sums below; %d fit a node:", svc, fit)
}

// sum spells out what the job Pods on one node ask for of one resource.
func (s Settings) sum(build, helper, service resource.Quantity) string {
	t := fmt.Sprintf("build %s + helper %s", build.String(), helper.String())
	if s.ServicesPerJob > 0 {
		t += fmt.Sprintf(" + %d × service %s", s.ServicesPerJob, service.String())
	}
	if s.JobsPerNode > 1 {
		t = fmt.Sprintf("%d × (%s)", s.JobsPerNode, t)
	}
	return t
}
