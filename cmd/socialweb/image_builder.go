package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/images"
)

// newImageBuilderCommand builds (or finds in the cache) the CI builder image: Debian
// with Go, Rust, gcc, make and git, plus go-junit-report, as an OCI layout tar for
// `socialweb image push`. It prints {"tar":..., "ref":..., "digest":...} as JSON.
func newImageBuilderCommand() *cobra.Command {
	var opts images.Options
	cmd := &cobra.Command{
		Use:   "builder",
		Short: "Build the CI builder image (Debian " + images.BuilderSuite + ", Go, Rust, gcc, make, git; needs root) and print its tar path and reference as JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Logger = newLogger(os.Stderr, 0)
			tarPath, digest, err := images.Builder(cmd.Context(), opts)
			if err != nil {
				return fmt.Errorf("building the builder image: %w", err)
			}
			b, err := json.Marshal(struct {
				Tar    string `json:"tar"`
				Ref    string `json:"ref"`
				Digest string `json:"digest"`
			}{tarPath, images.BuilderRef(), digest})
			if err != nil {
				return err
			}
			fmt.Println(string(b))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.CacheDir, "cache-dir", images.DefaultCacheDir(), "where built images are cached by fingerprint")
	f.StringVar(&opts.Go, "go", "go", "the go command that builds go-junit-report")
	f.BoolVar(&opts.Rebuild, "rebuild", false, "build even when the cache holds an image with the same fingerprint")
	documentEnv(f)
	return cmd
}
