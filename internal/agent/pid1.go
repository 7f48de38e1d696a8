package agent

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// reaper collects the zombies of orphans re-parented to PID 1 (shims that
// daemonized, anything whose parent died first).
//
// PID 1 is also the parent of processes that are waited for normally: the
// agent's own commands and containerd, and the in-process kubelet's
// commands (mount, umount, ...), which call Wait through os/exec. Reaping
// those with wait4(-1) would steal their exit status (Wait fails with
// ECHILD). So the reaper never waits for "any child": on SIGCHLD it lists
// zombie children of PID 1 in /proc and reaps only those that have been
// zombies for reapAfter, i.e. nobody is waiting for them. During shutdown
// it reaps at once.
type reaper struct {
	log   *slog.Logger
	mu    sync.Mutex
	eager bool
	kick  chan struct{}
}

func startReaper(log *slog.Logger) *reaper {
	r := &reaper{log: log, kick: make(chan struct{}, 1)}
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, syscall.SIGCHLD)
	go func() {
		for range sig {
			select {
			case r.kick <- struct{}{}:
			default:
			}
		}
	}()
	go r.loop()
	return r
}

func (r *reaper) setEager() {
	r.mu.Lock()
	r.eager = true
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

type procStat struct {
	state     byte
	ppid      int
	startTime uint64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseStat(string(b))
}

// parseStat reads state, ppid and starttime from /proc/<pid>/stat; the
// command name is in parentheses and may itself contain spaces and ')'.
func parseStat(s string) (procStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("malformed stat %q", s)
	}
	f := strings.Fields(s[i+1:])
	// fields after comm: state(3) ppid(4) ... starttime(22) -> f[0], f[1], f[19]
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("malformed stat %q", s)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, err
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, err
	}
	return procStat{state: f[0][0], ppid: ppid, startTime: start}, nil
}

func zombieChildren() map[int]uint64 {
	self := os.Getpid()
	out := map[int]uint64{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err == nil && st.state == 'Z' && st.ppid == self {
			out[pid] = st.startTime
		}
	}
	return out
}

// reapAfter is how long a zombie child must stay a zombie before the
// reaper takes it: os/exec's Wait reaps its child at once, so a zombie
// that old has nobody waiting for it.
const reapAfter = time.Second

func (r *reaper) loop() {
	type zombie struct {
		start uint64
		seen  time.Time
	}
	known := map[int]zombie{}
	var timer <-chan time.Time
	for {
		select {
		case <-r.kick:
		case <-timer:
		}
		timer = nil
		r.mu.Lock()
		eager := r.eager
		r.mu.Unlock()
		now := time.Now()
		next := map[int]zombie{}
		for pid, start := range zombieChildren() {
			z, ok := known[pid]
			if !ok || z.start != start {
				z = zombie{start, now}
			}
			if eager || now.Sub(z.seen) >= reapAfter {
				var ws syscall.WaitStatus
				if got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err == nil && got == pid {
					continue
				}
			}
			next[pid] = z
		}
		known = next
		if len(known) > 0 {
			timer = time.After(reapAfter / 2)
		}
	}
}

// watchSignals turns SIGTERM, SIGINT (Ctrl-Alt-Del) and SIGPWR into a
// shutdown.
func (a *Agent) watchSignals() func() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGPWR)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sig:
				a.Log.Info("signal", "signal", s.String())
				a.Stop("signal " + s.String())
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
	}
}

// KEY_POWER in linux/input-event-codes.h.
const keyPower = 116

// watchPowerButton loads the power button modules, then reads the input
// devices that offer KEY_POWER (the ACPI button driver bound to qemu
// microvm's GED power button) and asks for a shutdown when one is pressed.
func (a *Agent) watchPowerButton() {
	if _, err := a.run(a.bg, "", "modprobe", append([]string{"-a"}, a.Config.PowerButtonModules...)...); err != nil {
		a.Log.Warn("power button modules", "err", err)
	}
	watching := map[string]bool{}
	for i := 0; ; i++ {
		devs, _ := filepath.Glob("/sys/class/input/event*")
		for _, d := range devs {
			name := filepath.Base(d)
			if watching[name] {
				continue
			}
			caps, _ := os.ReadFile(filepath.Join(d, "device", "capabilities", "key"))
			if !hasKeyBit(string(caps), keyPower) {
				continue
			}
			f, err := os.Open("/dev/input/" + name)
			if err != nil {
				continue
			}
			watching[name] = true
			dev, _ := os.ReadFile(filepath.Join(d, "device", "name"))
			a.Log.Info("watching power button", "device", "/dev/input/"+name, "name", strings.TrimSpace(string(dev)),
				"uptime", fmt.Sprintf("%.2fs", a.Uptime().Seconds()))
			go a.readPowerButton(f)
		}
		// Input devices appear once the button driver binds; look every
		// second for a minute, then every 10 s.
		wait := time.Second
		if i > 60 {
			wait = 10 * time.Second
		}
		select {
		case <-a.bg.Done():
			return
		case <-time.After(wait):
		}
	}
}

// hasKeyBit reads a capabilities/key bitmap: hex words, most significant
// first, each the width of a long.
func hasKeyBit(caps string, bit int) bool {
	words := strings.Fields(caps)
	const w = 64
	idx := len(words) - 1 - bit/w
	if idx < 0 || idx >= len(words) {
		return false
	}
	v, err := strconv.ParseUint(words[idx], 16, 64)
	return err == nil && v&(1<<(bit%w)) != 0
}

func (a *Agent) readPowerButton(f *os.File) {
	defer f.Close()
	// struct input_event on 64-bit: timeval (16), type u16, code u16, value s32.
	buf := make([]byte, 24)
	for {
		if _, err := f.Read(buf); err != nil {
			return
		}
		typ := binary.LittleEndian.Uint16(buf[16:])
		code := binary.LittleEndian.Uint16(buf[18:])
		val := int32(binary.LittleEndian.Uint32(buf[20:]))
		if typ == 1 && code == keyPower && val == 1 {
			a.Log.Info("power button pressed")
			a.Stop("power button")
		}
	}
}
