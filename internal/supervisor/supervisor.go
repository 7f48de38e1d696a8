package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// Spec describes one supervised process.
type Spec struct {
	Name string
	Path string
	Args []string
	Env  []string
	// LogPath is opened to append and given to the process as its stdout and
	// stderr: a file, not a pipe to the daemon, so the process outlives the
	// daemon (it rotates the file itself; see logrotate.Stdio).
	LogPath    string
	RecordPath string // the instance record (pid + start time + cmdline + fingerprint)
	// Fingerprint names what this run is: the build of Path and the configuration
	// it reads. A later daemon adopts a running process of the same fingerprint
	// and replaces one of another, as its Upgrade says.
	Fingerprint string
	// Ready, if set, reports whether a run serves (nil error). A rolling upgrade
	// waits for it before it replaces the next process.
	Ready func(ctx context.Context) error
	// ExtraFiles are inherited by the process as fds 3, 4, ...: a listening socket
	// the daemon keeps open across the process's runs. The caller keeps them open.
	ExtraFiles []*os.File
	// Jail, if set, holds the process in a group with limits (its cgroup): each run
	// is moved in at once (an adopted one too), and a run the kernel OOM-killed
	// there says so.
	Jail Jail
	// Credential, if set, is the uid and gid the process runs as. Its log is then
	// opened as a file that uid may have replaced (tenantuid.OpenAppend), and Path
	// is executed through an fd the daemon opened: its directory may not be
	// searchable by that uid.
	Credential *syscall.Credential
	// BeforeStart, if set, runs before each run this supervisor starts (not before
	// an adopted one): it may change the files a run uses, since none runs.
	BeforeStart func() error
}

// Jail is a process group with limits (cgroup.Group).
type Jail interface {
	Add(pid int) error
	// OOMKills is how many processes the kernel OOM-killed in it so far.
	OOMKills() (int64, error)
}

// State is what the supervisor knows about one process.
type State struct {
	Running  bool
	PID      int
	Since    time.Time // start of the current run (its adoption), or time of the last exit
	Restarts int
	LastExit string
	// Adopted says the current run was started by an earlier daemon.
	Adopted bool
}

// Backoff bounds the delay between restarts; it doubles per crash and resets
// after a run longer than Reset.
type Backoff struct {
	Initial, Max, Reset time.Duration
}

// DefaultBackoff is 1s doubling to 30s, reset after a minute of running.
func DefaultBackoff() Backoff {
	return Backoff{Initial: time.Second, Max: 30 * time.Second, Reset: time.Minute}
}

// Supervisor keeps named processes running. Start and Stop are safe to call
// from any goroutine.
type Supervisor struct {
	log      *slog.Logger
	backoff  Backoff
	onChange func(name string)
	upgrade  *rollout

	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	spec  Spec
	stop  chan struct{}
	done  chan struct{}
	state State
	// stopGrace is written before stop is closed and read after.
	stopGrace time.Duration
}

// New returns a supervisor; onChange (may be nil) is called after a process
// starts or exits, so a controller can re-observe it. A process an earlier
// daemon left running is handled as upgrade says (UpgradeRolling if empty).
func New(log *slog.Logger, b Backoff, upgrade Upgrade, onChange func(name string)) *Supervisor {
	if onChange == nil {
		onChange = func(string) {}
	}
	return &Supervisor{log: log, backoff: b, onChange: onChange, procs: map[string]*proc{},
		upgrade: newRollout(upgrade, log)}
}

// Start begins supervising spec.Name; it is a no-op if already supervised. A
// process of spec.RecordPath that still runs (an earlier daemon's) is adopted
// or replaced, as the supervisor's Upgrade says.
func (s *Supervisor) Start(spec Spec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.procs[spec.Name]; ok {
		return
	}
	p := &proc{spec: spec, stop: make(chan struct{}), done: make(chan struct{})}
	s.procs[spec.Name] = p
	go s.loop(p)
}

// State returns the state of a supervised process.
func (s *Supervisor) State(name string) (State, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.procs[name]
	if !ok {
		return State{}, false
	}
	return p.state, true
}

// Rollout reports the upgrade in progress or halted (see Rollout).
func (s *Supervisor) Rollout() RolloutState { return s.upgrade.state() }

// Stop ends supervision: SIGTERM, then SIGKILL after grace. It returns once
// the process is gone and its record removed; stopping an unknown name is a
// no-op.
func (s *Supervisor) Stop(name string, grace time.Duration) {
	s.mu.Lock()
	p, ok := s.procs[name]
	if ok {
		delete(s.procs, name)
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	p.stopGrace = grace
	close(p.stop)
	<-p.done
}

// StopAll stops every process concurrently.
func (s *Supervisor) StopAll(grace time.Duration) {
	s.mu.Lock()
	names := make([]string, 0, len(s.procs))
	for n := range s.procs {
		names = append(names, n)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		go func() { defer wg.Done(); s.Stop(n, grace) }()
	}
	wg.Wait()
}

func (s *Supervisor) set(p *proc, f func(*State)) {
	s.mu.Lock()
	f(&p.state)
	s.mu.Unlock()
	s.onChange(p.spec.Name)
}

// run is one running instance: a child this supervisor started, or a process
// of an earlier daemon it adopted.
type run struct {
	pid     int
	exited  <-chan error // receives once, when the process is gone
	signal  func(syscall.Signal) error
	adopted bool
}

func (s *Supervisor) loop(p *proc) {
	defer close(p.done)
	log := s.log.With("process", p.spec.Name)
	delay := s.backoff.Initial
	// A process an earlier daemon left: adopted, or replaced (then the new run
	// reports to the rollout once it serves or fails).
	r, replacing := s.inherit(p, log)
	for {
		started := time.Now()
		ooms := jailOOMs(p.spec.Jail)
		var err error
		if r == nil {
			r, err = s.startOnce(p)
		}
		if err != nil {
			log.Error("start failed", "err", err)
			s.set(p, func(st *State) { st.Running = false; st.LastExit = err.Error(); st.Since = time.Now() })
			if replacing != nil {
				replacing.failed(err.Error())
				replacing = nil
			}
		} else {
			adopted := r.adopted
			s.set(p, func(st *State) { st.Running = true; st.PID = r.pid; st.Since = started; st.Adopted = adopted })
			exited := r.exited
			if replacing != nil {
				exited = replacing.watch(p.spec, r.exited)
				replacing = nil
			}
			select {
			case err = <-exited:
			case <-p.stop:
				_ = r.signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(p.stopGrace):
					_ = r.signal(syscall.SIGKILL)
					<-exited
				}
				_ = removeRecord(p.spec.RecordPath)
				return
			}
			_ = removeRecord(p.spec.RecordPath)
			msg := fmt.Sprintf("exited: %v", err)
			if err == nil {
				msg = "exited with status 0"
			}
			if ooms >= 0 && jailOOMs(p.spec.Jail) > ooms {
				msg = fmt.Sprintf("was OOM-killed at its memory limit (%v): raise the limit or find what grew", err)
			}
			log.Warn("process exited; restarting", "after", delay, "status", msg, "ran", time.Since(started).Round(time.Millisecond))
			s.set(p, func(st *State) { st.Running = false; st.Restarts++; st.LastExit = msg; st.Since = time.Now() })
		}
		r = nil
		if time.Since(started) > s.backoff.Reset {
			delay = s.backoff.Initial
		}
		select {
		case <-p.stop:
			return
		case <-time.After(delay):
		}
		delay = min(delay*2, s.backoff.Max)
	}
}

// inherit looks for a process of p's record that an earlier daemon left running.
// It returns the run when adopting it; with the process replaced (stopped here),
// it returns the rollout step the next run reports to. Neither: nothing ran.
func (s *Supervisor) inherit(p *proc, log *slog.Logger) (*run, *step) {
	rec, err := readRecord(p.spec.RecordPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		log.Warn("unreadable instance record; starting afresh", "record", p.spec.RecordPath, "err", err)
		_ = removeRecord(p.spec.RecordPath)
		return nil, nil
	}
	if !rec.Alive() {
		_ = removeRecord(p.spec.RecordPath)
		return nil, nil
	}
	same := rec.Fingerprint == p.spec.Fingerprint
	var st *step
	if !same {
		// It serves until its turn comes (a rolling upgrade may queue it).
		s.set(p, func(st *State) { st.Running = true; st.PID = rec.PID; st.Since = time.Now(); st.Adopted = true })
		var keep bool
		st, keep = s.upgrade.begin(p.spec.Name)
		if !keep {
			log.Info("replacing a process of another build or configuration", "pid", rec.PID, "upgrade", s.upgrade.mode)
			t0 := time.Now()
			if err := terminate(rec.Identity, 30*time.Second); err != nil {
				log.Error("stopping the earlier process", "pid", rec.PID, "err", err)
			}
			log.Info("stopped the earlier process", "pid", rec.PID, "took", time.Since(t0).Round(time.Millisecond))
			_ = removeRecord(p.spec.RecordPath)
			return nil, st
		}
	}
	r, err := adopt(rec.Identity, p.spec.Jail)
	if err != nil {
		log.Warn("adopting the earlier process failed; replacing it", "pid", rec.PID, "err", err)
		_ = terminate(rec.Identity, 30*time.Second)
		_ = removeRecord(p.spec.RecordPath)
		return nil, nil
	}
	if same {
		log.Info("adopted the process an earlier daemon started", "pid", rec.PID)
	} else {
		log.Warn("kept a process of another build or configuration", "pid", rec.PID, "upgrade", s.upgrade.mode,
			"why", s.upgrade.keepReason())
	}
	return r, nil
}

// startOnce starts one run: stdout and stderr appended to its log file.
func (s *Supervisor) startOnce(p *proc) (*run, error) {
	if p.spec.BeforeStart != nil {
		if err := p.spec.BeforeStart(); err != nil {
			return nil, fmt.Errorf("preparing the run: %w", err)
		}
	}
	cred := p.spec.Credential
	var logf *os.File
	var err error
	if cred != nil {
		logf, err = tenantuid.OpenAppend(p.spec.LogPath, tenantuid.Owner{UID: int(cred.Uid), GID: int(cred.Gid)})
	} else {
		logf, err = os.OpenFile(p.spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("opening the log: %w", err)
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(p.spec.Path, p.spec.Args...)
	cmd.Env = append(os.Environ(), p.spec.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = p.spec.ExtraFiles
	// Its own session: a terminal's Ctrl-C reaches the daemon, which stops children
	// in order, not all at once; and no parent-death signal: the process outlives a
	// daemon that dies, for the next one to adopt.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cred != nil {
		// The uid changes before the exec: the executable is reached through an fd
		// of the daemon's, /proc/self/fd/N, which resolves without searching its
		// directory. argv[0] stays its path (the instance record's command line).
		exe, err := os.Open(p.spec.Path)
		if err != nil {
			return nil, fmt.Errorf("opening the executable: %w", err)
		}
		defer exe.Close()
		cmd.ExtraFiles = append(slices.Clone(cmd.ExtraFiles), exe)
		cmd.Path = fmt.Sprintf("/proc/self/fd/%d", 2+len(cmd.ExtraFiles))
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: cred.Uid, Gid: cred.Gid, Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	kill := func() { _ = cmd.Process.Kill(); <-exited }
	if p.spec.Jail != nil {
		// At once: a run outside its limits is a tenant on the loose. The process is
		// still starting (a Go runtime), so nothing it allocated yet matters.
		if err := p.spec.Jail.Add(cmd.Process.Pid); err != nil {
			kill()
			return nil, fmt.Errorf("limiting the process: %w", err)
		}
	}
	id, err := ObserveStarted(cmd.Process.Pid)
	if err == nil {
		err = writeRecord(p.spec.RecordPath, Record{Identity: id, Fingerprint: p.spec.Fingerprint})
	}
	if err != nil {
		kill()
		return nil, fmt.Errorf("recording instance: %w", err)
	}
	return &run{pid: cmd.Process.Pid, exited: exited, signal: func(sig syscall.Signal) error { return cmd.Process.Signal(sig) }}, nil
}

// jailOOMs is j's OOM-kill count, -1 if it cannot be read (then no exit is
// called an OOM kill).
func jailOOMs(j Jail) int64 {
	if j == nil {
		return -1
	}
	n, err := j.OOMKills()
	if err != nil {
		return -1
	}
	return n
}
