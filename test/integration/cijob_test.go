package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// The job's project: a small, well-tested, dependency-free Go module nobody here wrote.
const (
	jobModule        = "github.com/google/uuid"
	jobModuleVersion = "v1.6.0"
)

// TestCIJob runs a real build as a GitLab CI job would on a tenant at zero nodes
// (issue 11 item 5), with only the credential `cluster runner-credential` mints, shaped
// like GitLab Runner's kubernetes executor with the attach strategy:
//   - a credentials Secret (kubernetes.io/dockercfg, in imagePullSecrets), an
//     init-permissions init container, and build and helper containers started with the
//     executor's shell-detection command and stdin open; repo, scripts and logs emptyDirs
//     at /builds, /scripts-<project>-<job> and /logs-<project>-<job>;
//   - the step script written to the build container's shell over pods/attach (stdin,
//     SPDY), appending its output and a {"command_exit_code": N} line to the log file;
//   - the log followed over pods/exec in the helper container (websocket), as the
//     executor's read-logs does, and the junit report read back over exec (SPDY).
//
// The job clones google/uuid (from the module proxy, committed into a bare repository
// the host serves over smart HTTP at the cluster's gateway), builds it with the builder
// image's Go and runs its test suite through go-junit-report. The Pod asks for 2 vCPU and
// 3 GiB, so the node booted for it has at least that. Under TCG on a 2-core host it took
// 7.5 minutes (measured): a 2 vCPU / 3.5 GiB node boot (~30 s), the 1.34 GiB builder
// image pull (5m10s), the job script (1 min: clone, build, 202 tests) and back to zero
// (30 s after a 20 s hold); building the builder image the first time adds ~2 minutes.
func TestCIJob(t *testing.T) {
	img := nodeImage(t)
	ctx := ctxT(t, 50*time.Minute)
	t0 := time.Now()
	builderTar, builderDigest, err := images.Builder(ctx, images.Options{Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatalf("building the builder image: %v", err)
	}
	t.Logf("builder image %s (%s) ready in %s", images.BuilderRef(), builderDigest, time.Since(t0).Round(time.Second))
	repos := gitRepoOfModule(t, ctx, jobModule, jobModuleVersion, "uuid")

	// Through the front door, as a runner on another machine reaches the tenant: the
	// credential names the door and the cluster's SNI name, so the attach, the execs and
	// the watches of the job all pass through it (issue 13).
	door := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	// The job clones from a git server on the host's gateway (GitLab's stand-in):
	// nodes reach no host port socialweb does not serve unless the operator opens it.
	gitPort := livetest.FreePort(t)
	d := newDaemon(t, 1, "--node-image", img, "--front-door", door, "--gateway-tcp-allow", strconv.Itoa(gitPort))
	// Pushed once, before the daemon starts, as an operator seeds the host registry.
	d.mustCLI("image", "push", builderTar)
	d.start()
	const hold = 20 * time.Second
	d.mustCLI("cluster", "create", "ci", "--wait", "--hold", hold.String(), "--max-nodes", "1",
		"--max-node-cpus", "2", "--max-node-memory", "4Gi", "--node-disk", "10Gi")
	_, admin := d.tenant("ci")
	credDir := filepath.Join(t.TempDir(), "runner")
	d.mustCLI("cluster", "runner-credential", "ci", "--out", credDir)
	runnerCfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(credDir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	if runnerCfg.Host != "https://"+door || !strings.HasPrefix(runnerCfg.TLSClientConfig.ServerName, "ci.") {
		t.Fatalf("the runner credential names %s (server name %q), want the front door %s and ci.<domain>",
			runnerCfg.Host, runnerCfg.TLSClientConfig.ServerName, door)
	}
	runner := kubernetes.NewForConfigOrDie(runnerCfg)
	gitURL := serveGit(t, net.JoinHostPort(d.cluster("ci").Status.Gateway, strconv.Itoa(gitPort)), repos)
	if nl, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil || len(nl.Items) != 0 {
		t.Fatalf("the cluster should start at zero nodes: %v (%v)", nl, err)
	}

	firstNode := firstNodeVersions(t, ctx, admin)
	job := newExecutorJob("gitlab-runner", 1, 7)
	tJob := time.Now()
	if _, err := runner.CoreV1().Secrets(job.ns).Create(ctx, job.secret(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the job's credentials Secret: %v", err)
	}
	pod, err := runner.CoreV1().Pods(job.ns).Create(ctx, job.pod(images.BuilderRef(), "busybox:stable"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the job Pod: %v", err)
	}
	job.name = pod.Name
	// The runner prints its Pod's events while it waits (FF_PRINT_POD_EVENTS): with its own
	// credential, whose Role reads events in its namespace alone, the Pod hears within 2 s
	// that a node is booting for it.
	booting := bootingEvent(t, ctx, runner, job.ns, job.name, 30*time.Second)
	if took := booting.Sub(tJob); took > 2*time.Second {
		t.Errorf("the job Pod's NodeBooting event came %s after it was created, want within 2s", took.Round(10*time.Millisecond))
	}
	// The executor waits for the Pod to run (poll_timeout); so does this.
	livetest.Eventually(t, 25*time.Minute, 2*time.Second, "the job Pod to run", func() bool {
		p, err := runner.CoreV1().Pods(job.ns).Get(ctx, job.name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodFailed && len(p.Status.ContainerStatuses) == 0 {
			// Once seen before nodes carried the storage startup taint: the kubelet's
			// admission refused the Pod on a node that had just registered.
			t.Fatalf("the job Pod was refused by its node before it ran: %s: %s", p.Status.Reason, p.Status.Message)
		}
		if err == nil && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded) {
			t.Fatalf("job Pod ended before the job ran: %s %s: %s %+v", p.Status.Phase, p.Status.Reason, p.Status.Message, p.Status.ContainerStatuses)
		}
		if err == nil {
			pod = p
		}
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	tRunning := time.Since(tJob)
	node, err := admin.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the job's node %q: %v", pod.Spec.NodeName, err)
	}
	checkRegisteredResources(t, firstNode(node.Name), node)
	cpu, mem := node.Status.Capacity[corev1.ResourceCPU], node.Status.Capacity[corev1.ResourceMemory]
	t.Logf("job Pod running on %s (%s vCPU, %s memory, %s ephemeral storage) %s after it was created; %s",
		node.Name, cpu.String(), mem.String(), ptr(node.Status.Capacity[corev1.ResourceEphemeralStorage]).String(), tRunning.Round(time.Second), pullEvent(ctx, runner, job))
	// The kernel keeps some memory from MemTotal: 3 GiB less 5% is still well above what
	// a default node has.
	if cpu.MilliValue() < 2000 || mem.Value() < 3<<30*95/100 {
		t.Errorf("the job's node has %s vCPU and %s memory; want at least 2 and 3Gi (sized from the job's requests)", cpu.String(), mem.String())
	}

	script := fmt.Sprintf(`set -eo pipefail
export GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local GOPATH=/builds/go GOCACHE=/builds/.cache/go-build
echo "job $CI_JOB_ID on $(hostname): $(nproc) CPUs, $(go version)"
git clone -q %s/uuid.git "$CI_PROJECT_DIR"
cd "$CI_PROJECT_DIR"
git log -1 --format='commit %%H %%s'
go build ./...
# TestVersion6 is taken out (renamed; bookworm's Go 1.19 has no go test -skip): uuid v1.6.0's
# NewV6 writes the version over bits 12-15 of its timestamp and Time() reads them back as
# time, so two UUIDs made across a 409.6 us boundary decode as "time reversed"; under TCG the
# calls are that far apart in most runs.
sed -i 's/^func TestVersion6(/func skippedTestVersion6(/' uuid_test.go
# One retry, as a CI admin sets "retry: 1" for a suite with a flaky test.
if ! go test -v -count=1 ./... 2>&1 | go-junit-report -set-exit-code -iocopy -out /builds/junit.xml; then
	echo "FAILED: $(grep -o 'testcase name="[^"]*"[^>]*>[[:space:]]*<failure' /builds/junit.xml | cut -d'"' -f2 | tr '\n' ' '); retrying once"
	cp /builds/junit.xml /builds/junit-first.xml
	go test -v -count=1 ./... 2>&1 | go-junit-report -set-exit-code -iocopy -out /builds/junit.xml
fi
echo job done
`, gitURL)
	tScript := time.Now()
	// As the executor does, the attach stream only delivers the script; the job's
	// progress and end come from the log. A failed attach ends the wait.
	attachCtx, stopAttach := context.WithCancel(ctx)
	defer stopAttach()
	followCtx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	attachErr := make(chan error, 1)
	go func() {
		err := job.attachScript(attachCtx, runnerCfg, runner, script)
		if err != nil && !errors.Is(err, context.Canceled) {
			stopFollow()
		}
		attachErr <- err
	}()
	exitCode, logText, err := job.followLog(followCtx, runnerCfg, runner, t)
	stopAttach()
	aerr := <-attachErr
	tScriptDur := time.Since(tScript)
	if err != nil {
		t.Fatalf("following the job log: %v (attach: %v)\nlog so far:\n%s", err, aerr, tail(logText, 40))
	}
	t.Logf("job script ran in %s, exit %d; log tail:\n%s", tScriptDur.Round(time.Second), exitCode, tail(logText, 12))
	for _, l := range strings.Split(logText, "\n") {
		if strings.HasPrefix(l, "FAILED: ") || strings.HasPrefix(l, "--- FAIL") {
			t.Logf("first run: %s", l) // which of the project's tests failed before the retry
		}
	}
	if exitCode != 0 {
		t.Errorf("the job failed (exit %d):\n%s", exitCode, tail(logText, 60))
	}
	report, err := job.execSPDY(ctx, runnerCfg, runner, "helper", "cat", "/builds/junit.xml")
	if err != nil {
		t.Fatalf("reading the junit report back over exec: %v", err)
	}
	tests, failures, errs, err := junitTotals([]byte(report))
	if err != nil {
		t.Fatalf("junit report: %v\n%s", err, tail(report, 20))
	}
	t.Logf("junit report: %d tests, %d failures, %d errors (%d bytes)", tests, failures, errs, len(report))
	if tests == 0 || failures != 0 || errs != 0 {
		t.Errorf("junit report: %d tests, %d failures, %d errors; want >0 tests and none failed", tests, failures, errs)
	}

	// The executor's cleanup: the Pod and the Secret go; the cluster falls back to zero.
	zero := int64(0)
	if err := runner.CoreV1().Pods(job.ns).Delete(ctx, job.name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Errorf("deleting the job Pod: %v", err)
	}
	if err := runner.CoreV1().Secrets(job.ns).Delete(ctx, job.secretName(), metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting the job's Secret: %v", err)
	}
	tGone := time.Now()
	livetest.Eventually(t, 5*time.Minute, 2*time.Second, "the cluster to fall back to zero nodes", func() bool {
		nl, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err == nil && len(nl.Items) == 0 && len(qemusOf(d.stateDir)) == 0
	})
	t.Logf("CI job: node %s vCPU/%s, Pod running after %s (boot and pull), script %s, back to zero %s after the job (hold %s); total %s",
		cpu.String(), mem.String(), tRunning.Round(time.Second), tScriptDur.Round(time.Second), time.Since(tGone).Round(time.Second), hold, time.Since(t0).Round(time.Second))

	// bench/cijob.sh: the same script on the host, in the builder image's own files.
	if out := os.Getenv("SOCIALWEB_BENCH_CIJOB_OUT"); out != "" {
		f := ciJobFigures{
			NodeCPU: cpu.String(), NodeMemory: mem.String(), NodeDisk: ptr(node.Status.Capacity[corev1.ResourceEphemeralStorage]).String(),
			PodRunningSeconds: tRunning.Seconds(), ScriptSeconds: tScriptDur.Seconds(), JobSeconds: tRunning.Seconds() + tScriptDur.Seconds(),
			ToZeroSeconds: time.Since(tGone).Seconds(), HoldSeconds: hold.Seconds(),
		}
		f.PullSeconds, f.ImageBytes = pullFigures(pullEvent(ctx, runner, job))
		f.HostScriptSeconds = hostBuild(t, ctx, builderTar, script, job)
		writeCIJobFigures(t, out, f)
	}
}

// ciJobFigures is what bench/cijob.sh reports.
type ciJobFigures struct {
	NodeCPU, NodeMemory, NodeDisk string
	PodRunningSeconds             float64 // Pod created -> running: decision, boot, pull
	PullSeconds                   float64 // the kubelet's figure for the builder image: fetch and unpack
	ImageBytes                    int64
	ScriptSeconds                 float64 // the job script on the node (clone, build, tests)
	JobSeconds                    float64 // Pod created -> script done
	HostScriptSeconds             float64 // the same script on the host
	ToZeroSeconds, HoldSeconds    float64
}

var pulledRE = regexp.MustCompile(`in ([0-9.hmsµ]+) \(.*Image size: ([0-9]+) bytes`)

// pullFigures reads the kubelet's Pulled event: `... in 5m10.3s (5m10.3s including
// waiting). Image size: N bytes.`
func pullFigures(msg string) (float64, int64) {
	m := pulledRE.FindStringSubmatch(msg)
	if m == nil {
		return 0, 0
	}
	d, _ := time.ParseDuration(m[1])
	n, _ := strconv.ParseInt(m[2], 10, 64)
	return d.Seconds(), n
}

// hostBuild runs the job's script on the host in a chroot of the builder image, with the
// build container's environment, and returns its wall time.
func hostBuild(t *testing.T, ctx context.Context, builderTar, script string, job *executorJob) float64 {
	root := t.TempDir()
	env := unpackImage(t, ctx, builderTar, root)
	env = append(env, "CI_JOB_ID="+fmt.Sprint(job.jobID), "CI_PROJECT_DIR="+job.buildDir, "CI_BUILDS_DIR=/builds", "HOME=/root")
	t0 := time.Now()
	out, err := runInRootfs(ctx, root, env, script)
	d := time.Since(t0)
	if err != nil || !strings.Contains(out, "job done") {
		t.Fatalf("the job's script on the host: %v\n%s", err, tail(out, 40))
	}
	t.Logf("the job's script on the host ran in %s; tail:\n%s", d.Round(time.Second), tail(out, 6))
	return d.Seconds()
}

func writeCIJobFigures(t *testing.T, path string, f ciJobFigures) {
	var b strings.Builder
	ratio := func(a, b float64) string { return fmt.Sprintf("%.2fx", a/b) }
	fmt.Fprintf(&b, "| figure | microVM node | host | ratio |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| node size chosen | %s vCPU, %s memory, %s ephemeral storage | %d cores | |\n", f.NodeCPU, f.NodeMemory, f.NodeDisk, runtime.NumCPU())
	fmt.Fprintf(&b, "| job script (clone, build, tests) | %.1f s | %.1f s | %s |\n", f.ScriptSeconds, f.HostScriptSeconds, ratio(f.ScriptSeconds, f.HostScriptSeconds))
	fmt.Fprintf(&b, "| job wall time (Pod created -> script done) | %.1f s | %.1f s | %s |\n", f.JobSeconds, f.HostScriptSeconds, ratio(f.JobSeconds, f.HostScriptSeconds))
	fmt.Fprintf(&b, "| Pod created -> running (decision, boot, pull) | %.1f s | | |\n", f.PodRunningSeconds)
	fmt.Fprintf(&b, "| builder image pull and unpack on the node (%d MiB) | %.1f s | | |\n", f.ImageBytes>>20, f.PullSeconds)
	fmt.Fprintf(&b, "| back to zero after the job (hold %.0f s) | %.1f s | | |\n", f.HoldSeconds, f.ToZeroSeconds)
	js, _ := json.MarshalIndent(f, "", "  ")
	if err := os.WriteFile(path, []byte(b.String()+"\n"+string(js)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("figures:\n%s", b.String())
}

func ptr(q resource.Quantity) *resource.Quantity { return &q }

// testWriter sends the builder's progress to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// executorJob is one CI job's Pod as GitLab Runner's kubernetes executor makes it.
type executorJob struct {
	ns                string
	project, jobID    int
	name              string // the Pod's, known once created (generateName)
	scripts, logs     string
	buildDir, logFile string
}

func newExecutorJob(ns string, project, jobID int) *executorJob {
	j := &executorJob{ns: ns, project: project, jobID: jobID}
	j.scripts = fmt.Sprintf("/scripts-%d-%d", project, jobID)
	j.logs = fmt.Sprintf("/logs-%d-%d", project, jobID)
	j.logFile = j.logs + "/output.log"
	j.buildDir = "/builds/socialweb/uuid"
	return j
}

func (j *executorJob) prefix() string {
	return fmt.Sprintf("runner-sw0test-project-%d-concurrent-0", j.project)
}

func (j *executorJob) secretName() string { return j.prefix() + "-creds" }

// secret is the executor's image pull credentials Secret: a job's registry credentials
// (CI_REGISTRY with the job token) as a dockercfg, referenced by imagePullSecrets. The
// registry named here is not the host registry, so the kubelet does not send it there.
func (j *executorJob) secret() *corev1.Secret {
	cfg, _ := json.Marshal(map[string]any{"registry.gitlab.invalid:5005": map[string]string{
		"username": "gitlab-ci-token", "password": "job-token", "email": "ci@gitlab.invalid"}})
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: j.secretName()},
		Type:       corev1.SecretTypeDockercfg,
		Data:       map[string][]byte{corev1.DockerConfigKey: cfg},
	}
}

// shellDetection is the executor's container command: exec the first shell found; it
// then reads the scripts the executor sends over attach from stdin.
const shellDetection = `if [ -x /usr/local/bin/bash ]; then exec /usr/local/bin/bash; ` +
	`elif [ -x /usr/bin/bash ]; then exec /usr/bin/bash; elif [ -x /bin/bash ]; then exec /bin/bash; ` +
	`elif [ -x /usr/local/bin/sh ]; then exec /usr/local/bin/sh; elif [ -x /usr/bin/sh ]; then exec /usr/bin/sh; ` +
	`elif [ -x /bin/sh ]; then exec /bin/sh; elif [ -x /busybox/sh ]; then exec /busybox/sh; ` +
	`else echo shell not found; exit 1; fi`

func (j *executorJob) pod(buildImage, helperImage string) *corev1.Pod {
	mounts := []corev1.VolumeMount{{Name: "repo", MountPath: "/builds"}, {Name: "scripts", MountPath: j.scripts}, {Name: "logs", MountPath: j.logs}}
	rl := func(cpu, mem, eph string) corev1.ResourceRequirements {
		r := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
		if eph != "" {
			r[corev1.ResourceEphemeralStorage] = resource.MustParse(eph)
		}
		return corev1.ResourceRequirements{Requests: r}
	}
	env := []corev1.EnvVar{
		{Name: "CI", Value: "true"}, {Name: "GITLAB_CI", Value: "true"},
		{Name: "CI_PROJECT_ID", Value: fmt.Sprint(j.project)}, {Name: "CI_JOB_ID", Value: fmt.Sprint(j.jobID)},
		{Name: "CI_PROJECT_DIR", Value: j.buildDir}, {Name: "CI_BUILDS_DIR", Value: "/builds"},
	}
	container := func(name, image string, res corev1.ResourceRequirements) corev1.Container {
		return corev1.Container{
			Name: name, Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"sh", "-c", shellDetection}, Stdin: true,
			Env: env, VolumeMounts: mounts, Resources: res,
		}
	}
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: j.prefix() + "-",
			Labels:       map[string]string{"pod": j.prefix(), "job.runner.gitlab.com/id": fmt.Sprint(j.jobID), "project.runner.gitlab.com/id": fmt.Sprint(j.project), "manager.runner.gitlab.com/name": "socialweb-test"},
			Annotations:  map[string]string{"job.runner.gitlab.com/url": fmt.Sprintf("https://gitlab.invalid/socialweb/uuid/-/jobs/%d", j.jobID)},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			ImagePullSecrets:              []corev1.LocalObjectReference{{Name: j.secretName()}},
			Volumes: []corev1.Volume{
				{Name: "repo", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "scripts", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "logs", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
			// The executor's init-permissions container, with the helper image.
			InitContainers: []corev1.Container{{
				Name: "init-permissions", Image: helperImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      []string{"sh", "-c", fmt.Sprintf("touch %[1]s && (chmod 777 %[1]s || exit 0)", j.logFile)},
				VolumeMounts: mounts, Resources: rl("200m", "128Mi", ""),
			}},
			// 2 vCPU and 3 GiB in all: the node is sized for them.
			Containers: []corev1.Container{
				container("build", buildImage, rl("1800m", "2944Mi", "2Gi")),
				container("helper", helperImage, rl("200m", "128Mi", "")),
			},
		},
	}
}

// attachScript sends the step script to the build container's shell over pods/attach
// (stdin only, SPDY), as the attach strategy does: the script is written to the scripts
// volume and run with its output and exit status appended to the log file.
func (j *executorJob) attachScript(ctx context.Context, cfg *rest.Config, k kubernetes.Interface, script string) error {
	path := j.scripts + "/step_script"
	stdin := fmt.Sprintf("cat > %[1]s <<'SOCIALWEB_STEP_SCRIPT'\n%[2]s\nSOCIALWEB_STEP_SCRIPT\n"+
		"bash %[1]s >> %[3]s 2>&1; echo \"{\\\"command_exit_code\\\": $?, \\\"script\\\": \\\"%[1]s\\\"}\" >> %[3]s\n",
		path, script, j.logFile)
	req := k.CoreV1().RESTClient().Post().Resource("pods").Namespace(j.ns).Name(j.name).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: "build", Stdin: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: strings.NewReader(stdin)})
}

var exitLineRE = regexp.MustCompile(`^\{"command_exit_code": (-?\d+), "script": "[^"]*"\}$`)

// followLog tails the job log in the helper container over pods/exec (websocket) from
// the last offset, reconnecting when a stream ends, until the exit status line appears.
func (j *executorJob) followLog(ctx context.Context, cfg *rest.Config, k kubernetes.Interface, t *testing.T) (int, string, error) {
	var log bytes.Buffer
	for ctx.Err() == nil {
		req := k.CoreV1().RESTClient().Post().Resource("pods").Namespace(j.ns).Name(j.name).SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: "helper", Command: []string{"tail", "-c", fmt.Sprintf("+%d", log.Len()+1), "-f", j.logFile}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
		ex, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
		if err != nil {
			return -1, log.String(), err
		}
		sctx, cancel := context.WithCancel(ctx)
		pr, pw := io.Pipe()
		code := make(chan int, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			sc := bufio.NewScanner(pr)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				log.WriteString(line + "\n")
				if m := exitLineRE.FindStringSubmatch(line); m != nil {
					var c int
					fmt.Sscan(m[1], &c)
					code <- c
					cancel()
				}
			}
			_, _ = io.Copy(io.Discard, pr)
		}()
		var stderr bytes.Buffer
		serr := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdout: pw, Stderr: &stderr})
		pw.Close()
		<-done
		cancel()
		select {
		case c := <-code:
			return c, log.String(), nil
		default:
		}
		t.Logf("log stream ended (%v, stderr %q) at offset %d; reconnecting", serr, stderr.String(), log.Len())
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	return -1, log.String(), ctx.Err()
}

// execSPDY runs a command in a container of the job Pod over pods/exec with SPDY.
func (j *executorJob) execSPDY(ctx context.Context, cfg *rest.Config, k kubernetes.Interface, container string, command ...string) (string, error) {
	req := k.CoreV1().RESTClient().Post().Resource("pods").Namespace(j.ns).Name(j.name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return stdout.String(), fmt.Errorf("%w (stderr %q)", err, stderr.String())
	}
	return stdout.String(), nil
}

// pullEvent is the kubelet's Pulled event of the build image, which says how long the
// pull took.
func pullEvent(ctx context.Context, k kubernetes.Interface, j *executorJob) string {
	el, err := k.CoreV1().Events(j.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + j.name})
	if err != nil {
		return "events: " + err.Error()
	}
	for _, e := range el.Items {
		if e.Reason == "Pulled" && strings.Contains(e.Message, "builder") {
			return "build image: " + e.Message
		}
	}
	return "no Pulled event for the build image"
}

// junitTotals sums tests, failures and errors over a junit report's test suites.
func junitTotals(report []byte) (tests, failures, errs int, err error) {
	var doc struct {
		XMLName xml.Name
		Suites  []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Errors   int `xml:"errors,attr"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(report, &doc); err != nil {
		return 0, 0, 0, fmt.Errorf("parsing: %w", err)
	}
	if doc.XMLName.Local != "testsuites" {
		return 0, 0, 0, fmt.Errorf("root element %q, want testsuites", doc.XMLName.Local)
	}
	for _, s := range doc.Suites {
		tests, failures, errs = tests+s.Tests, failures+s.Failures, errs+s.Errors
	}
	return tests, failures, errs, nil
}

// bootingEvent waits up to within for the socialweb driver's NodeBooting Event on Pod
// ns/name, read as the runner reads its Pod's events (core/v1, its own namespace), and
// returns when it was first seen.
func bootingEvent(t *testing.T, ctx context.Context, k kubernetes.Interface, ns, name string, within time.Duration) time.Time {
	t.Helper()
	var seen time.Time
	var last string
	livetest.Eventually(t, within, 100*time.Millisecond, "a NodeBooting event on the job Pod", func() bool {
		el, err := k.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			t.Fatalf("listing the job Pod's events with the runner's credential: %v", err)
		}
		for _, e := range el.Items {
			last = e.Reason + ": " + e.Message
			if e.Reason == "NodeBooting" && strings.Contains(e.Message, "for this Pod") && strings.Contains(e.Message, "about ") {
				seen = time.Now()
				t.Logf("the job Pod's event: %s %s: %s", e.Type, e.Reason, e.Message)
				return true
			}
		}
		return false
	})
	if seen.IsZero() {
		t.Fatalf("no NodeBooting event (last: %q)", last)
	}
	return seen
}
