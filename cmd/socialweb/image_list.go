package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/registry"
)

func newImageListCommand(g *globalOptions) *cobra.Command {
	var out output
	cmd := &cobra.Command{
		Use:   "list [-o json|yaml|wide]",
		Short: "List the images the host registry holds",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rs := &registry.Server{Dir: filepath.Join(g.stateDir, "registry"), Logger: newLogger(os.Stderr, 0)}
			list, err := rs.List()
			if err != nil {
				return fmt.Errorf("listing the registry in %s: %w", g.stateDir, err)
			}
			if out == outputJSON || out == outputYAML {
				return writeObject(os.Stdout, out, imageRecords(list))
			}
			return writeImageTable(os.Stdout, list, out == outputWide)
		},
	}
	addOutputFlag(cmd.Flags(), &out, "a table of name, tag, digest, size, seen by")
	documentEnv(cmd.Flags())
	return cmd
}

// imageRecord is one tag of the registry in `image list -o json|yaml`. Its
// field names are an interface: add fields, never rename them.
type imageRecord struct {
	Name      string `json:"name"` // canonical, e.g. docker.io/library/busybox
	Tag       string `json:"tag"`
	Digest    string `json:"digest"`    // of the manifest or index the tag points at
	MediaType string `json:"mediaType"` // of that manifest or index
	Size      int64  `json:"size"`      // bytes of it and all it references, each once
	Cluster   string `json:"cluster"`   // the only cluster whose nodes see it; "" is every cluster
}

// imageRecords is never nil, so that no images print as [] and not null.
func imageRecords(refs []registry.ImageRef) []imageRecord {
	out := make([]imageRecord, 0, len(refs))
	for _, r := range refs {
		out = append(out, imageRecord{Name: r.Name, Tag: r.Tag, Digest: r.Digest, MediaType: r.MediaType, Size: r.Size, Cluster: r.Cluster})
	}
	return out
}

// writeImageTable prints the registry's tags as `image list` does; wide adds each media type.
func writeImageTable(w io.Writer, refs []registry.ImageRef, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	header := "NAME\tTAG\tDIGEST\tSIZE\tSEEN BY"
	if wide {
		header += "\tMEDIA TYPE"
	}
	fmt.Fprintln(tw, header)
	for _, r := range refs {
		seen := "every cluster"
		if r.Cluster != "" {
			seen = "cluster " + r.Cluster
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s", r.Name, r.Tag, r.Digest, r.Size, seen)
		if wide {
			fmt.Fprintf(tw, "\t%s", r.MediaType)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
