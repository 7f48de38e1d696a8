// Command accelprobe measures what choosing the node accelerator costs, side by side in
// one run: the KVM probe cold (a guest of the image's kernel booted under KVM, or the wait
// for one that does not boot) and cached (the verdict read back for this host boot), and
// the daemon's start to its `serving` log line with --accel tcg (no probe), auto with an
// empty verdict cache, and auto with the verdict cached. Each is repeated -runs times;
// the table has the median and the ratio to the tcg start.
//
//	go run ./bench/accelprobe -bin bin/socialweb -image DIR [-runs 3]
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
)

func main() {
	bin := flag.String("bin", "bin/socialweb", "socialweb binary")
	image := flag.String("image", "", "node image directory (`socialweb image build --ensure` prints it)")
	runs := flag.Int("runs", 3, "repetitions of each measurement")
	flag.Parse()
	if *image == "" {
		log.Fatal("-image is required")
	}
	ctx := context.Background()

	var cold, cached []time.Duration
	var evidence string
	for range *runs {
		cache, err := os.MkdirTemp("", "socialweb-accelprobe-")
		if err != nil {
			log.Fatal(err)
		}
		pc := qemu.ProbeConfig{ImageDir: *image, CacheDir: cache}
		t0 := time.Now()
		r, err := qemu.ProbeKVM(ctx, pc)
		if err != nil {
			log.Fatal(err)
		}
		cold = append(cold, time.Since(t0))
		evidence = r.Evidence()
		t1 := time.Now()
		if r2, err := qemu.ProbeKVM(ctx, pc); err != nil || (r.DeviceErr == "" && !r2.Cached) {
			log.Fatalf("second probe not from the cache: %+v, %v", r2, err)
		}
		cached = append(cached, time.Since(t1))
		os.RemoveAll(cache)
	}
	fmt.Printf("probe: %s\n\n", evidence)

	starts := map[string][]time.Duration{}
	modes := []string{"tcg", "auto, empty verdict cache", "auto, verdict cached"}
	for range *runs {
		cache, err := os.MkdirTemp("", "socialweb-accelprobe-")
		if err != nil {
			log.Fatal(err)
		}
		for _, m := range modes {
			accel := "auto"
			if m == "tcg" {
				accel = "tcg"
			}
			d, err := timeToServing(*bin, *image, accel, cache)
			if err != nil {
				log.Fatalf("%s: %v", m, err)
			}
			starts[m] = append(starts[m], d)
		}
		os.RemoveAll(cache)
	}

	fmt.Printf("| measurement | median of %d | runs | ratio to the tcg start |\n|---|---|---|---|\n", *runs)
	base := median(starts["tcg"])
	row := func(name string, ds []time.Duration, ratio bool) {
		r := "-"
		if ratio {
			r = fmt.Sprintf("%.2f", float64(median(ds))/float64(base))
		}
		fmt.Printf("| %s | %s | %s | %s |\n", name, median(ds).Round(time.Millisecond), list(ds), r)
	}
	row("probe, cold", cold, false)
	row("probe, cached", cached, false)
	for _, m := range modes {
		row("serve --accel "+m+": start to serving", starts[m], true)
	}
}

// timeToServing starts a daemon on a fresh state dir, with XDG_CACHE_HOME=cache (where
// its probe verdicts live), and returns the time until it logs "serving".
func timeToServing(bin, image, accel, cache string) (time.Duration, error) {
	state, err := os.MkdirTemp("", "socialweb-accelprobe-state-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(state)
	cmd := exec.Command(bin, "serve", "--state-dir", state, "--node-image", image, "--accel", accel,
		"--api-port", strconv.Itoa(freePort()), "--port-range", func() string { p := freePort(); return fmt.Sprintf("%d-%d", p, p) }(),
		"--network-range", "180-189", "--metrics-address", "")
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cache)
	out, err := cmd.StderrPipe()
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var last []string
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, `"msg":"serving"`) {
			d := time.Since(t0)
			go func() { // keep draining so the daemon never blocks on its stderr
				for sc.Scan() {
				}
			}()
			return d, nil
		}
		last = append(last, l)
	}
	return 0, fmt.Errorf("the daemon exited before serving: %s", strings.Join(last[max(0, len(last)-5):], "\n"))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func list(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, d.Round(time.Millisecond).String())
	}
	return strings.Join(parts, ", ")
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
