package qemu

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

func detectHost() (host, error) {
	h := host{CPUs: runtime.NumCPU()}
	mem, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return h, fmt.Errorf("reading the host's memory size: %w", err)
	}
	if h.MemoryMiB, err = memTotalMiB(mem); err != nil {
		return h, err
	}
	if ci, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		h.TSCkHz = tscKHz(ci)
	}
	return h, nil
}

// memTotalMiB parses MemTotal out of /proc/meminfo.
func memTotalMiB(meminfo []byte) (int64, error) { return meminfoMiB(meminfo, "MemTotal") }

// meminfoMiB parses one "<field>: <n> kB" line of /proc/meminfo, in MiB.
func meminfoMiB(meminfo []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb / 1024, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", field)
}

// tscKHz is the host's "cpu MHz" in kHz. Under TCG the guest TSC runs at the host's
// rate; telling the guest kernel that rate (tsc_early_khz=) skips its TSC calibration
// against the PIT, which fails on a loaded host and stalls the boot (see nodeimage's
// boot test).
func tscKHz(cpuinfo []byte) int64 {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "cpu MHz"); ok {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimLeft(v, " \t:")), 64)
			if err == nil && mhz > 0 {
				return int64(mhz * 1000)
			}
		}
	}
	return 0
}

const tmpfsMagic = 0x01021994

func isTmpfs(dir string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && st.Type == tmpfsMagic
}

// freeBytes is the space available to the daemon on dir's filesystem.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}
