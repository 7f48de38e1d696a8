package nodeimage

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// moduleIndex is what depmod wrote for one kernel.
type moduleIndex struct {
	dir     string              // /lib/modules/<version>
	path    map[string]string   // module name -> relative .ko path
	deps    map[string][]string // module name -> names it depends on
	builtin map[string]bool
	softPre map[string][]string // module name -> soft pre-dependencies (names or aliases)
	alias   map[string][]string // alias -> module names
}

// modName normalizes "kernel/drivers/virtio/virtio_ring.ko[.xz]" or "virtio-ring" to
// "virtio_ring".
func modName(s string) string {
	s = filepath.Base(s)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		s = strings.TrimSuffix(s, ext)
	}
	s = strings.TrimSuffix(s, ".ko")
	return strings.ReplaceAll(s, "-", "_")
}

func readLines(file string, fn func(string)) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fn(sc.Text())
	}
	return sc.Err()
}

func loadModuleIndex(dir string) (*moduleIndex, error) {
	ix := &moduleIndex{dir: dir, path: map[string]string{}, deps: map[string][]string{},
		builtin: map[string]bool{}, softPre: map[string][]string{}, alias: map[string][]string{}}
	err := readLines(filepath.Join(dir, "modules.dep"), func(l string) {
		mod, deps, ok := strings.Cut(l, ":")
		if !ok {
			return
		}
		n := modName(mod)
		ix.path[n] = mod
		for _, d := range strings.Fields(deps) {
			ix.deps[n] = append(ix.deps[n], modName(d))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading modules.dep (was depmod run?): %w", err)
	}
	if err := readLines(filepath.Join(dir, "modules.builtin"), func(l string) {
		if l = strings.TrimSpace(l); l != "" {
			ix.builtin[modName(l)] = true
		}
	}); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	_ = readLines(filepath.Join(dir, "modules.softdep"), func(l string) {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "softdep" {
			return
		}
		n := modName(f[1])
		inPre := false
		for _, w := range f[2:] {
			switch w {
			case "pre:":
				inPre = true
			case "post:":
				inPre = false
			default:
				if inPre {
					ix.softPre[n] = append(ix.softPre[n], w)
				}
			}
		}
	})
	_ = readLines(filepath.Join(dir, "modules.alias"), func(l string) {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "alias" {
			ix.alias[f[1]] = append(ix.alias[f[1]], modName(f[2]))
		}
	})
	return ix, nil
}

// resolve turns a wanted name or alias into a module name, and whether it is built in.
// ok is false when the kernel has neither a module nor a built-in by that name.
func (ix *moduleIndex) resolve(want string) (name string, builtin, ok bool) {
	n := modName(want)
	if ix.builtin[n] {
		return n, true, true
	}
	if _, has := ix.path[n]; has {
		return n, false, true
	}
	for _, m := range ix.alias[want] {
		if ix.builtin[m] {
			return m, true, true
		}
		if _, has := ix.path[m]; has {
			return m, false, true
		}
	}
	return n, false, false
}

// loadOrder returns the relative .ko paths to insmod, dependencies (hard, then soft
// pre-dependencies) before dependents and otherwise in the order asked for. Built-in
// modules are skipped and reported; a name that is neither a module nor built in is an
// error, but a soft dependency that is missing is ignored, like modprobe does.
func (ix *moduleIndex) loadOrder(wanted []string) (order []string, builtin []string, err error) {
	done := map[string]bool{}
	var visit func(want string, soft bool, stack []string) error
	visit = func(want string, soft bool, stack []string) error {
		n, bi, ok := ix.resolve(want)
		if !ok {
			if soft {
				return nil
			}
			return fmt.Errorf("kernel module %s: not in %s/modules.dep nor in modules.builtin", want, ix.dir)
		}
		if done[n] {
			return nil
		}
		for _, s := range stack {
			if s == n {
				return nil // cycle (soft deps can form one): modprobe ignores it too
			}
		}
		stack = append(stack, n)
		if bi {
			done[n] = true
			builtin = append(builtin, n)
			return nil
		}
		for _, s := range ix.softPre[n] {
			if err := visit(s, true, stack); err != nil {
				return err
			}
		}
		for _, d := range ix.deps[n] {
			if err := visit(d, false, stack); err != nil {
				return err
			}
		}
		done[n] = true
		order = append(order, ix.path[n])
		return nil
	}
	for _, w := range wanted {
		if err := visit(w, false, nil); err != nil {
			return nil, nil, err
		}
	}
	return order, builtin, nil
}
