package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	_ "embed"
)

//go:embed pause/main.go
var pauseSource []byte

type pauseIn struct {
	GoVersion string `json:"goVersion"`
	SourceSHA string `json:"sourceSHA256"`
}

func (o Options) goCmd() string {
	if o.Go != "" {
		return o.Go
	}
	return "go"
}

// goEnv is the environment of the pause build: the caller's (PATH, HOME, GOCACHE...) with
// everything that changes the output pinned.
func goEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "CGO_ENABLED", "GOOS", "GOARCH", "GOAMD64", "GOARM64", "GOFLAGS", "GOWORK", "GOTOOLCHAIN", "GOEXPERIMENT", "GO111MODULE", "GOPROXY":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOAMD64=v1", "GOARM64=v8.0",
		"GOFLAGS=", "GOWORK=off", "GOTOOLCHAIN=local", "GOEXPERIMENT=", "GO111MODULE=on", "GOPROXY=off")
}

func pauseInputs(ctx context.Context, opts Options) (pauseIn, error) {
	goCmd := opts.goCmd()
	if _, err := exec.LookPath(goCmd); err != nil {
		return pauseIn{}, fmt.Errorf("images: the pause image is built with the Go toolchain: %w: %v", errNoTool, err)
	}
	cmd := exec.CommandContext(ctx, goCmd, "env", "GOVERSION")
	cmd.Env = goEnv()
	out, err := cmd.Output()
	if err != nil {
		return pauseIn{}, fmt.Errorf("images: %s env GOVERSION: %w", goCmd, err)
	}
	sum := sha256.Sum256(pauseSource)
	return pauseIn{GoVersion: strings.TrimSpace(string(out)), SourceSHA: hex.EncodeToString(sum[:])}, nil
}

// pauseImage compiles the embedded pause program into a static binary (trimmed paths, no
// build id, no VCS stamp: the bytes depend only on the source and the Go version) and
// makes it the image's only file.
func pauseImage(ctx context.Context, work string, in pauseIn, opts Options) (imageSpec, error) {
	src := filepath.Join(work, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return imageSpec{}, err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module socialweb.computer/pause\n\ngo 1.24\n"), 0o644); err != nil {
		return imageSpec{}, err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), pauseSource, 0o644); err != nil {
		return imageSpec{}, err
	}
	bin := filepath.Join(work, "pause")
	cmd := exec.CommandContext(ctx, opts.goCmd(), "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", bin, ".")
	cmd.Dir, cmd.Env = src, goEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return imageSpec{}, fmt.Errorf("images: go build of pause: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return imageSpec{}, err
	}
	layer, err := layerTar([]tarFile{{path: "pause", mode: 0o755, typ: tar.TypeReg, data: b}})
	if err != nil {
		return imageSpec{}, err
	}
	return imageSpec{
		layers:  []blob{layer},
		history: []string{"socialweb images: pause built with " + in.GoVersion + " (CGO_ENABLED=0)"},
		config: containerConfig{
			User:       "65535:65535",
			Entrypoint: []string{"/pause"},
			WorkingDir: "/",
			Labels:     map[string]string{"computer.socialweb.image.source": "internal/images/pause " + in.GoVersion},
		},
	}, nil
}
