// Package buildinfo says which build of socialweb is running: its version, the
// commit it was built from, the Kubernetes it carries, and the Go toolchain.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"k8s.io/component-base/version"
)

// KubernetesModule is the module whose version is the Kubernetes socialweb runs.
const KubernetesModule = "k8s.io/kubernetes"

// Info is one build. Its JSON field names are an interface (`socialweb version -o
// json`): add fields, never rename them.
type Info struct {
	// Version is the main module's: a tag, a pseudo-version, or "(devel)".
	Version string `json:"version"`
	// Commit is the VCS revision built, "unknown" without VCS stamping (go test,
	// -buildvcs=false); Modified says the tree had changes not committed.
	Commit     string `json:"commit"`
	CommitTime string `json:"commitTime,omitempty"`
	Modified   bool   `json:"modified"`
	// Kubernetes is the k8s.io/kubernetes module linked in. KubernetesReported is
	// what the in-process components (apiserver, kubelet) report as their version:
	// stamped with -ldflags by hack/build; a plain `go build` leaves it at
	// v0.0.0-master, which breaks version-skew checks.
	Kubernetes         string `json:"kubernetes"`
	KubernetesReported string `json:"kubernetesReported"`
	Go                 string `json:"go"`
	Platform           string `json:"platform"` // GOOS/GOARCH
}

// Read returns the running binary's build.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	i := FromBuildInfo(bi)
	i.KubernetesReported = version.Get().GitVersion
	if i.Kubernetes == "unknown" && strings.HasPrefix(i.KubernetesReported, "v1.") {
		i.Kubernetes = i.KubernetesReported
	}
	if i.Go == "" {
		i.Go = runtime.Version()
	}
	if i.Platform == "" {
		i.Platform = runtime.GOOS + "/" + runtime.GOARCH
	}
	return i
}

// FromBuildInfo turns what the Go toolchain recorded into an Info; bi may be nil
// (a binary built without module support). Go and Platform are left empty when bi
// does not say; Read fills them from the runtime.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	i := Info{Version: "(devel)", Commit: "unknown", Kubernetes: "unknown"}
	if bi == nil {
		return i
	}
	if v := bi.Main.Version; v != "" {
		i.Version = v
	}
	i.Go = bi.GoVersion
	var goos, goarch string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Commit = s.Value
		case "vcs.time":
			i.CommitTime = s.Value
		case "vcs.modified":
			i.Modified = s.Value == "true"
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	if goos != "" && goarch != "" {
		i.Platform = goos + "/" + goarch
	}
	for _, d := range bi.Deps {
		if d.Path != KubernetesModule {
			continue
		}
		i.Kubernetes = d.Version
		if d.Replace != nil && d.Replace.Version != "" {
			i.Kubernetes = d.Replace.Version
		}
	}
	return i
}

// CommitString is the commit as people read it: "(modified)" marks a tree with
// changes not committed.
func (i Info) CommitString() string {
	if i.Modified {
		return i.Commit + " (modified)"
	}
	return i.Commit
}

// String is the build as `socialweb version` prints it, one fact a line.
func (i Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "socialweb %s\n", i.Version)
	fmt.Fprintf(&b, "commit:      %s\n", i.CommitString())
	if i.CommitTime != "" {
		fmt.Fprintf(&b, "commit time: %s\n", i.CommitTime)
	}
	k := i.Kubernetes
	if i.KubernetesReported != "" && i.KubernetesReported != i.Kubernetes {
		k += fmt.Sprintf(" (its components report %s: build with hack/build to stamp it)", i.KubernetesReported)
	}
	fmt.Fprintf(&b, "kubernetes:  %s\n", k)
	fmt.Fprintf(&b, "go:          %s\n", i.Go)
	fmt.Fprintf(&b, "platform:    %s\n", i.Platform)
	return b.String()
}
