// Package nodeimage builds the node image a socialweb microVM boots from: a Debian kernel
// (vmlinuz), a busybox initramfs that loads the virtio drivers and switch_roots, and a
// debootstrapped rootfs.ext4, described by a manifest.json and cached by a fingerprint of
// every input that changes those artifacts.
//
// The input is a nodeimage.json file (see Spec). Ensure builds an image unless the cache
// already holds one with the same fingerprint; Lookup only checks. Building needs root
// (debootstrap, chroot) and the Debian host tools named by CheckTools.
//
// Cache layout (DefaultCacheDir is $XDG_CACHE_HOME/socialweb, else ~/.cache/socialweb, for
// every user including root):
//
//	<cache>/images/<fingerprint>/{vmlinuz,initramfs.cpio.gz,rootfs.ext4,manifest.json}
//	<cache>/images/.build-<fingerprint>-*/   in-progress builds; never look complete
//	<cache>/layers/debootstrap/<key>/tree    debootstrap results, keyed by their own inputs
//	<cache>/layers/debs/*.deb                downloaded kernel and busybox packages
package nodeimage

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Limits and defaults of a Spec.
const (
	DefaultVCPU          = 1
	MaxVCPU              = 64
	DefaultMemMiB        = 1024
	MinMemMiB            = 256
	MaxMemMiB            = 1 << 20 // 1 TiB
	DefaultHeadroomMiB   = 1024
	MinHeadroomMiB       = 64
	MaxDiskMiB           = 16 << 20 // 16 TiB
	DefaultKernelPackage = "linux-image-cloud-amd64"
	DefaultSuite         = "bookworm"
	DefaultMirror        = "http://deb.debian.org/debian"
	DefaultCmdline       = "console=ttyS0 root=/dev/vda rw panic=-1"
	DefaultInit          = "/sbin/init"

	// BaseTreeMiB is a conservative lower bound on the size of the debootstrapped tree
	// (measured about 420 MB with the base packages); used only to reject impossible
	// diskMiB values before anything is built. The exact check happens at mkfs time.
	BaseTreeMiB = 400
)

// BasePackages are always passed to debootstrap --include; Spec.Packages adds to them.
// nftables is kube-proxy's backend (its nft); iptables stays for the portmap plugin.
var BasePackages = []string{
	"containerd", "runc", "containernetworking-plugins", "iptables", "nftables", "conntrack",
	"ca-certificates", "iproute2", "kmod",
}

// Spec is the content of nodeimage.json. Zero values mean "default" (see ParseSpec).
type Spec struct {
	// VCPU and MemMiB size the microVM booted from the image.
	VCPU   int `json:"vcpu,omitempty"`
	MemMiB int `json:"memMiB,omitempty"`
	// DiskMiB is the size of rootfs.ext4 (the node's root disk). 0 means "tree + headroomMiB".
	DiskMiB int `json:"diskMiB,omitempty"`
	// HeadroomMiB is the free space added on top of the rootfs tree when DiskMiB is 0, and
	// the free space DiskMiB must leave when it is set.
	HeadroomMiB int `json:"headroomMiB,omitempty"`
	// KernelPackage is the Debian package of the kernel, usually a metapackage that depends
	// on exactly one linux-image-<abi> package.
	KernelPackage string `json:"kernelPackage,omitempty"`
	Suite         string `json:"suite,omitempty"`
	// Mirror defaults to the host's apt source that serves Suite (see HostMirror).
	Mirror string `json:"mirror,omitempty"`
	// Packages are installed into the rootfs in addition to BasePackages.
	Packages []string `json:"packages,omitempty"`
	// Cmdline is the kernel command line without socialweb.init=, which Init sets.
	Cmdline string `json:"cmdline,omitempty"`
	// Init is the program the initramfs switch_roots to, a path inside the rootfs.
	Init string `json:"init,omitempty"`
}

// SpecKeys returns the keys nodeimage.json accepts, in declaration order.
func SpecKeys() []string {
	return []string{"vcpu", "memMiB", "diskMiB", "headroomMiB", "kernelPackage", "suite",
		"mirror", "packages", "cmdline", "init"}
}

// LoadSpec reads and parses a nodeimage.json. A missing file is an error; use
// ParseSpec(nil) for an all-defaults spec.
func LoadSpec(file string) (Spec, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Spec{}, err
	}
	s, err := ParseSpec(data)
	if err != nil {
		return Spec{}, fmt.Errorf("%s: %w", file, err)
	}
	return s, nil
}

// ParseSpec parses nodeimage.json strictly (unknown or mis-cased keys and trailing data
// are errors), applies defaults and validates. Empty input means "all defaults". The
// mirror default comes from the host's apt sources (HostMirror).
func ParseSpec(data []byte) (Spec, error) {
	return ParseSpecOver(Spec{}, data)
}

// ParseSpecOver is ParseSpec with base's fields in place of the keys data does not set
// (a caller's own defaults, such as an init other than DefaultInit).
func ParseSpecOver(base Spec, data []byte) (Spec, error) {
	s := base
	s.Packages = append([]string(nil), base.Packages...)
	if len(bytes.TrimSpace(data)) > 0 {
		if err := checkKeys(data); err != nil {
			return Spec{}, err
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			return Spec{}, fmt.Errorf("nodeimage.json: %w", err)
		}
		if _, err := dec.Token(); err != io.EOF {
			return Spec{}, errors.New("nodeimage.json: unexpected data after the top-level object")
		}
	}
	if err := s.Complete(); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// checkKeys rejects keys that are not exactly one of SpecKeys. encoding/json matches keys
// case-insensitively, so DisallowUnknownFields alone would accept "memmib".
func checkKeys(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("nodeimage.json: %w", err)
	}
	valid := SpecKeys()
	var unknown []string
	for k := range raw {
		found := false
		for _, v := range valid {
			if k == v {
				found = true
				break
			}
		}
		if !found {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	k := unknown[0]
	hint := ""
	for _, v := range valid {
		if strings.EqualFold(k, v) {
			hint = fmt.Sprintf(" (did you mean %q? keys are case-sensitive)", v)
		}
	}
	return fmt.Errorf("nodeimage.json: unknown key %q%s; valid keys are: %s",
		k, hint, strings.Join(valid, ", "))
}

var (
	debPackageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	suiteRE      = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

// Complete applies defaults to zero fields and validates the result.
func (s *Spec) Complete() error {
	if s.VCPU == 0 {
		s.VCPU = DefaultVCPU
	}
	if s.MemMiB == 0 {
		s.MemMiB = DefaultMemMiB
	}
	if s.HeadroomMiB == 0 {
		s.HeadroomMiB = DefaultHeadroomMiB
	}
	if s.KernelPackage == "" {
		s.KernelPackage = DefaultKernelPackage
	}
	if s.Suite == "" {
		s.Suite = DefaultSuite
	}
	if s.Cmdline == "" {
		s.Cmdline = DefaultCmdline
	}
	if s.Init == "" {
		s.Init = DefaultInit
	}
	if s.Mirror == "" && suiteRE.MatchString(s.Suite) {
		s.Mirror = HostMirror(s.Suite)
	}
	s.Mirror = strings.TrimRight(s.Mirror, "/")
	return s.Validate()
}

// Validate checks a completed Spec; every error says what would be accepted.
func (s Spec) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if s.VCPU < 1 || s.VCPU > MaxVCPU {
		bad("vcpu %d is out of range: use 1..%d (and no more than the host's cores)", s.VCPU, MaxVCPU)
	}
	if s.MemMiB < MinMemMiB {
		bad("memMiB %d is below the minimum %d: use at least %d (the Debian cloud kernel with containerd needs it)", s.MemMiB, MinMemMiB, MinMemMiB)
	} else if s.MemMiB > MaxMemMiB {
		bad("memMiB %d is above the maximum %d (1 TiB)", s.MemMiB, MaxMemMiB)
	}
	if s.HeadroomMiB < MinHeadroomMiB {
		bad("headroomMiB %d is below the minimum %d: use at least %d so the node can write logs and container state", s.HeadroomMiB, MinHeadroomMiB, MinHeadroomMiB)
	}
	if s.DiskMiB < 0 {
		bad("diskMiB %d is negative: use 0 for tree + headroomMiB, or a size of at least %d", s.DiskMiB, BaseTreeMiB+s.HeadroomMiB)
	} else if s.DiskMiB > MaxDiskMiB {
		bad("diskMiB %d is above the maximum %d (16 TiB)", s.DiskMiB, MaxDiskMiB)
	} else if s.DiskMiB > 0 && s.DiskMiB < BaseTreeMiB+s.HeadroomMiB {
		bad("diskMiB %d cannot hold the base system (about %d MiB) plus headroomMiB %d: use diskMiB >= %d, lower headroomMiB, or 0 for automatic sizing",
			s.DiskMiB, BaseTreeMiB, s.HeadroomMiB, BaseTreeMiB+s.HeadroomMiB)
	}
	if !debPackageRE.MatchString(s.KernelPackage) {
		bad("kernelPackage %q is not a Debian package name (e.g. %s)", s.KernelPackage, DefaultKernelPackage)
	}
	if !suiteRE.MatchString(s.Suite) {
		bad("suite %q is not a Debian suite name (e.g. %s)", s.Suite, DefaultSuite)
	}
	if !strings.HasPrefix(s.Mirror, "http://") && !strings.HasPrefix(s.Mirror, "https://") {
		bad("mirror %q must be an http:// or https:// URL (e.g. %s)", s.Mirror, DefaultMirror)
	}
	for _, p := range s.Packages {
		if !debPackageRE.MatchString(p) {
			bad("packages: %q is not a Debian package name (lowercase letters, digits, + - .)", p)
		}
	}
	if strings.ContainsAny(s.Cmdline, "\n\r\x00") {
		bad("cmdline must be a single line")
	}
	for _, f := range strings.Fields(s.Cmdline) {
		if strings.HasPrefix(f, "socialweb.init=") {
			bad("cmdline must not set socialweb.init=; use the \"init\" key")
		}
	}
	if !path.IsAbs(s.Init) || path.Clean(s.Init) != s.Init || strings.ContainsAny(s.Init, " \t\n") {
		bad("init %q must be a clean absolute path inside the rootfs without spaces (e.g. %s)", s.Init, DefaultInit)
	}
	return errors.Join(errs...)
}

// IncludePackages is the sorted, deduplicated debootstrap --include list.
func (s Spec) IncludePackages() []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range append(append([]string{}, BasePackages...), s.Packages...) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// FullCmdline is the kernel command line the image is booted with.
func (s Spec) FullCmdline() string {
	return strings.TrimSpace(s.Cmdline) + " socialweb.init=" + s.Init
}

// aptSourcesRoot is where HostMirror looks for etc/apt; tests point it at testdata.
var aptSourcesRoot = "/"

// HostMirror returns the URI of the host's first apt source that serves suite (deb type,
// main component), or DefaultMirror when there is none. It reads etc/apt/sources.list,
// etc/apt/sources.list.d/*.list and *.sources (deb822).
func HostMirror(suite string) string {
	if m := mirrorFromSources(aptSourcesRoot, suite); m != "" {
		return m
	}
	return DefaultMirror
}

func mirrorFromSources(root, suite string) string {
	dir := filepath.Join(root, "etc/apt")
	files := []string{filepath.Join(dir, "sources.list")}
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(dir, "sources.list.d", pat))
		sort.Strings(m)
		files = append(files, m...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var m string
		if strings.HasSuffix(f, ".sources") {
			m = mirrorDeb822(data, suite)
		} else {
			m = mirrorOneLine(data, suite)
		}
		if m != "" {
			return strings.TrimRight(m, "/")
		}
	}
	return ""
}

func mirrorOneLine(data []byte, suite string) string {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // options: [arch=amd64 signed-by=...]
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) == 0 {
				continue
			}
			f = f[1:]
		}
		if len(f) >= 3 && f[1] == suite && contains(f[2:], "main") {
			return f[0]
		}
	}
	return ""
}

func mirrorDeb822(data []byte, suite string) string {
	for _, para := range strings.Split(strings.ReplaceAll(string(data), "\r", ""), "\n\n") {
		fields := map[string]string{}
		var last string
		for _, line := range strings.Split(para, "\n") {
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			if (line[0] == ' ' || line[0] == '\t') && last != "" {
				fields[last] += " " + strings.TrimSpace(line)
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
		if strings.EqualFold(fields["enabled"], "no") {
			continue
		}
		if !contains(strings.Fields(fields["types"]), "deb") ||
			!contains(strings.Fields(fields["suites"]), suite) ||
			!contains(strings.Fields(fields["components"]), "main") {
			continue
		}
		if uris := strings.Fields(fields["uris"]); len(uris) > 0 {
			return uris[0]
		}
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
