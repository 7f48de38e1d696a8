package nodeimage

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ProbeMarker is the line the accelerator probe's init prints once the guest kernel has
// booted far enough to run a user-space program.
const ProbeMarker = "SOCIALWEB-ACCEL-PROBE-OK"

// ProbeInit is the probe's init in its initramfs; boot it with rdinit=ProbeInit.
const ProbeInit = "/socialweb-accel-probe"

// ProbeScript is the probe's init, run by the image initramfs's busybox: it prints the
// marker and reboots (qemu -no-reboot turns that into an exit).
const ProbeScript = `#!/bin/sh
echo "` + ProbeMarker + `"
/bin/reboot -f
`

// WriteProbeInitramfs writes the accelerator probe's initramfs: the image's own
// initramfs (its busybox) with a second cpio archive appended that adds ProbeInit. The
// kernel unpacks concatenated archives in order, so the image's file is used unchanged.
func WriteProbeInitramfs(w io.Writer, imageDir string) error {
	f, err := os.Open(filepath.Join(imageDir, FileInitramfs))
	if err != nil {
		return fmt.Errorf("probe initramfs: %w", err)
	}
	defer f.Close()
	if _, err := io.Copy(w, f); err != nil {
		return fmt.Errorf("probe initramfs: copying the image's: %w", err)
	}
	var extra bytes.Buffer
	if err := writeCpio(&extra, []cpioEntry{
		{Name: ProbeInit[1:], Mode: cpioFile | 0o755, Data: []byte(ProbeScript)},
	}); err != nil {
		return err
	}
	_, err = w.Write(extra.Bytes())
	return err
}
