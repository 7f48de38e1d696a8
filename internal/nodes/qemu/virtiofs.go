package qemu

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/layershare"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// virtiofsdOverheadMiB is host memory a VM's virtiofsd costs. Measured (TestLiveLayerShare,
// TCG, 512 MiB guest): 3 MiB RSS for virtiofsd and 3 MiB for its sandboxed child once the
// guest has mounted the share and stacked two layers; it grows with the inodes the guest
// holds (an O_PATH fd and a few hundred bytes each) and with the pages of the guest's
// shared memory it touches for I/O (already counted in qemu's RSS). 32 leaves room for a
// guest that walks many layers.
const virtiofsdOverheadMiB = 32

// startVirtiofsd starts the node's virtiofsd (through the read-only wrapper), waits until
// it listens on its socket, and records its identity. It is our child and lives in its
// own session, like qemu.
func (p *Provider) startVirtiofsd(inst *instance) error {
	logf, err := os.OpenFile(filepath.Join(inst.dir, fileVirtiofsLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := p.cfg.Layers.Command(inst.dir, sockVirtiofs)
	cmd.Dir = inst.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	p.mu.Lock()
	inst.vproc, inst.vdone = cmd.Process, done
	p.mu.Unlock()
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(done)
		p.log.Debug("virtiofsd exited", "node", inst.rec.Request.Name, "pid", cmd.Process.Pid, "status", exitText(waitErr))
	}()
	said := func() string {
		if t := tailLines(filepath.Join(inst.dir, fileVirtiofsLog), 10); t != "" {
			return "; it said: " + strings.ReplaceAll(t, "\n", " | ")
		}
		return ""
	}
	// Listening, not merely bound: qemu connects once, as it starts, and gives up if
	// that fails. Until the wrapper has exec'd virtiofsd, the process has no socket.
	deadline := time.Now().Add(p.cfg.StartTimeout)
	for !listening(cmd.Process.Pid) {
		select {
		case <-done:
			return fmt.Errorf("virtiofsd exited before it listened (%s)%s", exitText(waitErr), said())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("virtiofsd did not listen on %s within %s%s", sockVirtiofs, p.cfg.StartTimeout, said())
		}
		time.Sleep(5 * time.Millisecond)
	}
	id, err := supervisor.Observe(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("virtiofsd exited at once%s", said())
	}
	return p.update(inst, func(r *record) { r.Virtiofsd = &id })
}

// listening reports whether process pid holds a listening unix socket.
func listening(pid int) bool {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	if len(inodes) == 0 {
		return false
	}
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode [Path]; Flags has __SO_ACCEPTCON
		// (0x10000) on a listening socket.
		fl := strings.Fields(sc.Text())
		if len(fl) < 7 || !inodes[fl[6]] {
			continue
		}
		if flags, err := strconv.ParseUint(fl[3], 16, 32); err == nil && flags&0x10000 != 0 {
			return true
		}
	}
	return false
}

// virtiofsdAlive reports whether the node's virtiofsd runs.
func (in *instance) virtiofsdAlive() bool {
	if in.vdone != nil {
		select {
		case <-in.vdone:
			return false
		default:
			return true
		}
	}
	return in.rec.Virtiofsd != nil && in.rec.Virtiofsd.Alive()
}

// stopVirtiofsd ends the node's virtiofsd once its qemu is gone. virtiofsd exits by
// itself when qemu closes the connection; one that does not (qemu never connected, or
// was killed mid-handshake) is terminated, then killed. Signals go only to the recorded
// process.
func (p *Provider) stopVirtiofsd(inst *instance) error {
	alive := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return inst.virtiofsdAlive()
	}
	wait := func(d time.Duration) bool {
		deadline := time.Now().Add(d)
		for alive() {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(20 * time.Millisecond)
		}
		return true
	}
	if !alive() || wait(time.Second) {
		return nil
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if inst.vproc != nil {
			_ = inst.vproc.Signal(sig)
		} else if id := inst.rec.Virtiofsd; id != nil && id.Alive() {
			_ = syscall.Kill(id.PID, sig)
		}
		if wait(3 * time.Second) {
			return nil
		}
	}
	pid := 0
	if inst.vproc != nil {
		pid = inst.vproc.Pid
	} else if inst.rec.Virtiofsd != nil {
		pid = inst.rec.Virtiofsd.PID
	}
	return fmt.Errorf("virtiofsd (pid %d) survived SIGKILL", pid)
}

// ownedVirtiofsd reports whether process pid is a virtiofsd (or its wrapper) serving a
// node of stateDir, and the one the provider started: not the sandboxed child virtiofsd
// forks, which dies with its parent (PR_SET_PDEATHSIG) and is never recorded.
func ownedVirtiofsd(pid int, stateDir string) bool {
	serves := func(pid int) bool {
		owner := layershare.Owner(pid)
		return owner != "" && strings.HasPrefix(owner, stateDir+"/")
	}
	return serves(pid) && !serves(parentPID(pid))
}

// parentPID is pid's parent, 0 if unknown.
func parentPID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
