package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/internal/daemon"
)

// defaultStateDir is where a root-run daemon keeps its state.
const defaultStateDir = "/var/lib/socialweb"

type globalOptions struct {
	stateDir string
}

func (g *globalOptions) addFlags(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&g.stateDir, "state-dir", defaultStateDir, "directory holding the daemon's state")
	documentEnv(cmd.PersistentFlags())
}

// mgmtClients are clients of the management API.
type mgmtClients struct {
	rest *rest.Config
	dyn  dynamic.Interface
	kube kubernetes.Interface
}

func (g *globalOptions) connect(ctx context.Context) (*mgmtClients, error) {
	path := filepath.Join(g.stateDir, daemon.AdminKubeconfig)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no management API credentials at %s: start the daemon with `socialweb serve --state-dir %s` (or set --state-dir / $SOCIALWEB_STATE_DIR to the daemon's)", path, g.stateDir)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := kube.Discovery().ServerVersion(); err != nil {
		return nil, fmt.Errorf("the management API at %s does not answer (%v): is `socialweb serve --state-dir %s` running?", cfg.Host, err, g.stateDir)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &mgmtClients{rest: cfg, dyn: dyn, kube: kube}, nil
}
