package layershare

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/core/snapshots"
	"google.golang.org/grpc"
)

// Server serves a snapshotter to containerd as a proxy plugin
// ([proxy_plugins.<name>] type = "snapshot", address = the socket).
type Server struct {
	grpc   *grpc.Server
	socket string
	done   chan error
}

// Serve listens on the unix socket (replacing a stale one) and serves sn
// until Stop. It returns once the socket accepts connections, so containerd
// may start right after.
func Serve(sn snapshots.Snapshotter, socket string) (*Server, error) {
	if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
		return nil, err
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing a stale %s: %w", socket, err)
	}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("snapshotter socket: %w", err)
	}
	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(sn))
	s := &Server{grpc: srv, socket: socket, done: make(chan error, 1)}
	go func() { s.done <- srv.Serve(ln) }()
	return s, nil
}

// Stop ends the server: the calls in flight get grace to finish.
func (s *Server) Stop(grace time.Duration) error {
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(grace):
		s.grpc.Stop()
	}
	err := <-s.done
	os.Remove(s.socket)
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return err
}
