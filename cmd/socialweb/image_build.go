package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/guestbuild"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// imageBuildResult is the last line `image build` prints.
type imageBuildResult struct {
	State        string  `json:"state"` // built or reused
	Fingerprint  string  `json:"fingerprint"`
	Dir          string  `json:"dir"`
	BuildSeconds float64 `json:"seconds"`
}

func newImageBuildCommand() *cobra.Command {
	var (
		file, cacheDir, source, containerd, runc, output string
		ensure                                           bool
	)
	cmd := &cobra.Command{
		Use:   "build [-f nodeimage.json] [--ensure]",
		Short: "Build the node image microVMs boot from: kernel, initramfs, rootfs with containerd and the socialweb-node agent",
		Long: `Build the node image microVMs boot from, from Debian packages and this source tree.

The image directory holds vmlinuz, initramfs.cpio.gz, rootfs.ext4 and manifest.json, under
<cache-dir>/images/<fingerprint>. The fingerprint covers every input: package versions, the
nodeimage.json values, and the agent, containerd and runc binaries (so the agent's source).
Without --ensure the image is built even if one with the same fingerprint exists; with
--ensure that one is reused. Progress goes to stderr; the last line on stdout is JSON:
{"state":"built"|"reused","fingerprint":...,"dir":...}; with -o dir it is the dir alone, for a
shell variable. Pass the dir to serve --node-image.

Needs root (debootstrap, chroot), the Debian tools hack/deps installs (gcc and libseccomp-dev
for runc among them), and the Go toolchain
(the agent is built from the socialweb source tree at --source).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "json" && output != "dir" {
				return usageError{fmt.Errorf("-o %q: want json (the default) or dir", output)}
			}
			var data []byte
			if file != "" {
				var err error
				if data, err = os.ReadFile(file); err != nil {
					return usageError{fmt.Errorf("--file: %w", err)}
				}
			}
			spec, err := nodeimage.ParseSpecOver(guestbuild.AgentSpecDefaults(), data)
			if err != nil {
				return usageError{err}
			}
			log := newLogger(os.Stderr, 0)
			b := guestbuild.Builder{ModuleDir: source, Progress: func(m string) { log.Info(m, "step", "guest-programs") }}
			opts := nodeimage.Options{CacheDir: cacheDir, Rebuild: !ensure, Progress: func(step, m string) {
				log.Info(m, "step", step)
			}}
			res, err := b.NodeImage(cmd.Context(), spec, opts, containerd, runc)
			if err != nil {
				return fmt.Errorf("building the node image: %w", err)
			}
			if res.State == nodeimage.StateReused {
				log.Info("an image with this fingerprint exists; reused it (drop --ensure to rebuild)", "dir", res.Dir)
			} else {
				log.Info("node image built", "dir", res.Dir, "took", res.Duration)
			}
			if output == "dir" {
				fmt.Println(res.Dir)
				return nil
			}
			line, err := json.Marshal(imageBuildResult{State: res.State, Fingerprint: res.Fingerprint, Dir: res.Dir,
				BuildSeconds: res.Duration.Seconds()})
			if err != nil {
				return err
			}
			fmt.Println(string(line))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "nodeimage.json (keys: vcpu, memMiB, diskMiB, headroomMiB, kernelPackage, suite, mirror, packages, cmdline, init); empty means all defaults")
	f.StringVarP(&output, "output", "o", "json", "the last line on stdout: json (state, fingerprint, dir) or dir (the image directory alone)")
	f.BoolVar(&ensure, "ensure", false, "reuse an image whose fingerprint matches instead of rebuilding it")
	f.StringVar(&cacheDir, "cache-dir", nodeimage.DefaultCacheDir(), "where images, layers and guest program builds are cached")
	f.StringVar(&source, "source", "", "the socialweb source tree the agent is built from; empty means the one containing the working directory")
	f.StringVar(&containerd, "containerd-version", guestbuild.DefaultContainerdVersion, "containerd 2.x release built for the guests")
	f.StringVar(&runc, "runc-version", guestbuild.DefaultRuncVersion, "runc 1.x release built for the guests (static, with cgo: needs gcc and libseccomp-dev)")
	documentEnv(f)
	return cmd
}
