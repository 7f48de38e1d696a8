package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Spec describes one supervised process.
type Spec struct {
	Name       string
	Path       string
	Args       []string
	Env        []string
	LogPath    string // stdout and stderr are appended here, rotated (SetLogRotation)
	RecordPath string // the instance record (pid + start time + cmdline)
	// ExtraFiles are inherited by the process as fds 3, 4, ...: a listening socket
	// the daemon keeps open across the process's runs. The caller keeps them open.
	ExtraFiles []*os.File
	// Jail, if set, holds the process in a group with limits (its cgroup): each run
	// is moved in at once, and a run the kernel OOM-killed there says so.
	Jail Jail
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
	Since    time.Time // start of the current run, or time of the last exit
	Restarts int
	LastExit string
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

	mu    sync.Mutex
	procs map[string]*proc
	rot   LogRotation
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
// starts or exits, so a controller can re-observe it.
func New(log *slog.Logger, b Backoff, onChange func(name string)) *Supervisor {
	if onChange == nil {
		onChange = func(string) {}
	}
	return &Supervisor{log: log, backoff: b, onChange: onChange, procs: map[string]*proc{}}
}

// SetLogRotation bounds the logs of every process from its next run on; the
// default never rotates.
func (s *Supervisor) SetLogRotation(r LogRotation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rot = r
}

// outputGrace is how long a run's output is still copied after it exited: a
// process it left behind may hold the pipe open (and Stop waits that long).
const outputGrace = time.Second

// Start begins supervising spec.Name; it is a no-op if already supervised.
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

func (s *Supervisor) loop(p *proc) {
	defer close(p.done)
	log := s.log.With("process", p.spec.Name)
	delay := s.backoff.Initial
	for {
		started := time.Now()
		ooms := jailOOMs(p.spec.Jail)
		cmd, logf, err := s.startOnce(p)
		if err != nil {
			log.Error("start failed", "err", err)
			s.set(p, func(st *State) { st.Running = false; st.LastExit = err.Error(); st.Since = time.Now() })
		} else {
			s.set(p, func(st *State) { st.Running = true; st.PID = cmd.Process.Pid; st.Since = started })
			exited := make(chan error, 1)
			go func() {
				// Wait returns once the output is copied (or outputGrace passed).
				err := cmd.Wait()
				if err := logf.Close(); err != nil {
					log.Warn("closing the log", "err", err)
				}
				exited <- err
			}()
			select {
			case err = <-exited:
			case <-p.stop:
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(p.stopGrace):
					_ = cmd.Process.Kill()
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

// startOnce starts one run; its log is closed by the caller after cmd.Wait.
func (s *Supervisor) startOnce(p *proc) (*exec.Cmd, *logFile, error) {
	s.mu.Lock()
	rot := s.rot
	s.mu.Unlock()
	logf, err := openLogFile(p.spec.LogPath, rot, s.log.With("process", p.spec.Name))
	if err != nil {
		return nil, nil, err
	}
	cmd, err := s.startCmd(p, logf)
	if err != nil {
		_ = logf.Close()
		return nil, nil, err
	}
	return cmd, logf, nil
}

func (s *Supervisor) startCmd(p *proc, logf *logFile) (*exec.Cmd, error) {
	cmd := exec.CommandContext(context.Background(), p.spec.Path, p.spec.Args...)
	cmd.Env = append(os.Environ(), p.spec.Env...)
	// Not an *os.File: exec then gives the child one pipe for both, and copies
	// from it through logf, which can rotate the file under it.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = outputGrace
	cmd.ExtraFiles = p.spec.ExtraFiles
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: a terminal's Ctrl-C reaches the daemon,
		// which stops children in order, not all at once.
		Setpgid: true,
		// If the daemon dies without stopping it (kill -9), so does the child.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if p.spec.Jail != nil {
		// At once: a run outside its limits is a tenant on the loose. The process is
		// still starting (a Go runtime), so nothing it allocated yet matters.
		if err := p.spec.Jail.Add(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("limiting the process: %w", err)
		}
	}
	id, err := ObserveStarted(cmd.Process.Pid)
	if err == nil {
		err = writeRecord(p.spec.RecordPath, id)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("recording instance: %w", err)
	}
	return cmd, nil
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
