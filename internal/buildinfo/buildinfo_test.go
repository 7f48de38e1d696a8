package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i+1 < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want Info
	}{
		{"no build info", nil, Info{Version: "(devel)", Commit: "unknown", Kubernetes: "unknown"}},
		{"a clean tree build", &debug.BuildInfo{
			GoVersion: "go1.26.6",
			Main:      debug.Module{Path: "github.com/socialweb-computer/socialweb", Version: "v0.4.0"},
			Deps:      []*debug.Module{{Path: "k8s.io/apimachinery", Version: "v0.37.2"}, {Path: "k8s.io/kubernetes", Version: "v1.37.2"}},
			Settings: settings("GOOS", "linux", "GOARCH", "amd64", "vcs", "git", "vcs.revision", "164bed4a",
				"vcs.time", "2025-01-02T03:04:05Z", "vcs.modified", "false"),
		}, Info{Version: "v0.4.0", Commit: "164bed4a", CommitTime: "2025-01-02T03:04:05Z", Kubernetes: "v1.37.2", Go: "go1.26.6", Platform: "linux/amd64"}},
		{"a modified tree, devel version, replaced kubernetes", &debug.BuildInfo{
			GoVersion: "go1.26.6",
			Main:      debug.Module{Path: "github.com/socialweb-computer/socialweb", Version: "(devel)"},
			Deps:      []*debug.Module{{Path: "k8s.io/kubernetes", Version: "v1.37.0", Replace: &debug.Module{Path: "k8s.io/kubernetes", Version: "v1.37.2"}}},
			Settings:  settings("GOOS", "linux", "GOARCH", "arm64", "vcs.revision", "abc", "vcs.modified", "true"),
		}, Info{Version: "(devel)", Commit: "abc", Modified: true, Kubernetes: "v1.37.2", Go: "go1.26.6", Platform: "linux/arm64"}},
		{"no VCS stamp, no kubernetes, no main version (go test)", &debug.BuildInfo{
			GoVersion: "go1.26.6",
			Deps:      []*debug.Module{{Path: "k8s.io/client-go", Version: "v0.37.2"}},
		}, Info{Version: "(devel)", Commit: "unknown", Kubernetes: "unknown", Go: "go1.26.6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromBuildInfo(tc.bi); got != tc.want {
				t.Errorf("FromBuildInfo =\n %+v, want\n %+v", got, tc.want)
			}
		})
	}
}

func TestReadFillsFromTheRuntime(t *testing.T) {
	i := Read()
	if i.Go != runtime.Version() {
		t.Errorf("Go = %q, want %q", i.Go, runtime.Version())
	}
	if want := runtime.GOOS + "/" + runtime.GOARCH; i.Platform != want {
		t.Errorf("Platform = %q, want %q", i.Platform, want)
	}
	if i.KubernetesReported == "" {
		t.Error("KubernetesReported is empty")
	}
	// A test binary links k8s.io/kubernetes only through what this package imports
	// (nothing): it is unknown or the stamped component version, never empty.
	if i.Kubernetes == "" {
		t.Error("Kubernetes is empty")
	}
}

func TestString(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Info
		want []string
		not  []string
	}{
		{"stamped", Info{Version: "v0.4.0", Commit: "abc", CommitTime: "2025-01-02T03:04:05Z", Kubernetes: "v1.37.2", KubernetesReported: "v1.37.2", Go: "go1.26.6", Platform: "linux/amd64"},
			[]string{"socialweb v0.4.0\n", "commit:      abc\n", "commit time: 2025-01-02T03:04:05Z\n", "kubernetes:  v1.37.2\n", "go:          go1.26.6\n", "platform:    linux/amd64\n"},
			[]string{"modified", "hack/build"}},
		{"modified, not stamped", Info{Version: "(devel)", Commit: "abc", Modified: true, Kubernetes: "v1.37.2", KubernetesReported: "v0.0.0-master+$Format:%H$", Go: "go1.26.6", Platform: "linux/amd64"},
			[]string{"commit:      abc (modified)\n", "kubernetes:  v1.37.2 (its components report v0.0.0-master+$Format:%H$: build with hack/build to stamp it)\n"},
			[]string{"commit time"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.in.String()
			for _, w := range tc.want {
				if !strings.Contains(s, w) {
					t.Errorf("String() lacks %q:\n%s", w, s)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(s, n) {
					t.Errorf("String() has %q:\n%s", n, s)
				}
			}
		})
	}
}
