package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/nodeservice"
)

// newImageBuiltinCommand writes the built-in images (pause, busybox) as OCI layout
// tars into a directory, for `serve --builtin-images DIR` on a host that cannot build
// them (no Go toolchain): hack/package ships them. It prints {"NAME": "PATH", ...}.
func newImageBuiltinCommand() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "builtin --out DIR",
		Short: "Write the built-in images (pause, busybox) as OCI layout tars into DIR, for serve --builtin-images (builds them: needs the Go toolchain and Debian's mirror)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usageError{errf("--out DIR is required: where to write pause.tar and busybox.tar")}
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return fmt.Errorf("--out %s: %w", out, err)
			}
			log := newLogger(os.Stderr, 0)
			written := map[string]string{}
			for _, name := range images.Builtin() {
				src, err := nodeservice.BuiltinImage(cmd.Context(), name, "", log)
				if err != nil {
					return fmt.Errorf("image %s: %w", name, err)
				}
				data, err := os.ReadFile(src) // a few MiB
				if err != nil {
					return fmt.Errorf("image %s: %w", name, err)
				}
				dst := filepath.Join(out, name+".tar")
				if err := atomicfile.Write(dst, data, 0o644); err != nil {
					return fmt.Errorf("image %s: %w", name, err)
				}
				written[name] = dst
			}
			b, err := json.Marshal(written)
			if err != nil {
				return err
			}
			fmt.Println(string(b))
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "the directory to write pause.tar and busybox.tar into (made if missing; files there are replaced)")
	documentEnv(cmd.Flags())
	return cmd
}
