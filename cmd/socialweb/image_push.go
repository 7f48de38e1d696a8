package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/layerstore"
	"github.com/socialweb-computer/socialweb/internal/registry"
)

func newImagePushCommand(g *globalOptions) *cobra.Command {
	var (
		refs    []string
		shared  bool
		cluster string
	)
	cmd := &cobra.Command{
		Use:   "push TARBALL [--ref NAME:TAG]",
		Short: "Load an OCI layout or docker-save tarball into the host registry nodes pull from",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes one TARBALL (an OCI layout or `docker save` tar, optionally gzipped)", cmd.CommandPath())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if cluster != "" {
				// Checked first: an image pushed for a cluster that is not there would
				// sit where no node ever looks.
				if _, err := os.Stat(filepath.Join(g.stateDir, "clusters", cluster)); err != nil {
					return usageError{fmt.Errorf("--cluster %s: no such cluster on this host (state dir %s; `socialweb cluster list` names them)", cluster, g.stateDir)}
				}
			}
			f, err := os.Open(args[0])
			if err != nil {
				return fmt.Errorf("opening %s: %w", args[0], err)
			}
			defer f.Close()
			log := newLogger(os.Stderr, 0)
			rs := &registry.Server{Dir: filepath.Join(g.stateDir, "registry"), Logger: log}
			var layers []registry.Layer
			if shared {
				rs.LayersStored = func(ls []registry.Layer) { layers = append(layers, ls...) }
			}
			var loaded []string
			if cluster != "" {
				loaded, err = rs.ImportFor(cmd.Context(), cluster, f, refs...)
			} else {
				loaded, err = rs.Import(cmd.Context(), f, refs...)
			}
			if err != nil {
				return fmt.Errorf("loading %s: %w", args[0], err)
			}
			for _, r := range loaded {
				fmt.Println(r)
			}
			if len(layers) > 0 {
				// Here, not left to the daemon: the push returns with the image's layers
				// ready for nodes. A layer that fails is only logged: nodes pull it.
				prepareLayers(cmd.Context(), filepath.Join(g.stateDir, "layers"), rs, layers, log)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&refs, "ref", nil, "name the image (e.g. docker.io/library/app:1); the tarball must then hold one image")
	cmd.Flags().StringVar(&cluster, "cluster", "", "push the image for this cluster's nodes alone (they see it before a shared image of the same name; no other cluster sees it; it goes when the cluster is deleted); empty pushes it for every cluster")
	cmd.Flags().BoolVar(&shared, "shared-layers", true, "also unpack the image's layers into <state-dir>/layers, where node VMs of a serve --shared-layers find them (a daemon also does it for images it finds missing when it starts)")
	documentEnv(cmd.Flags())
	return cmd
}

// prepareLayers unpacks layers into the layer store at dir, logging each.
func prepareLayers(ctx context.Context, dir string, rs *registry.Server, layers []registry.Layer, log *slog.Logger) {
	store, err := layerstore.Open(dir)
	if err != nil {
		log.Warn("layers not prepared; nodes will pull them", "err", err)
		return
	}
	prep, err := layerstore.NewPreparer(store, rs, layerstore.PreparerConfig{Log: log})
	if err != nil {
		log.Warn("layers not prepared; nodes will pull them", "err", err)
		return
	}
	prep.Watch(rs)
	rs.LayersStored(layers)
	prep.Start(ctx)
	if err := prep.Wait(ctx); err != nil {
		log.Warn("preparing layers interrupted; the daemon finishes them when it next starts", "err", err)
	}
}
