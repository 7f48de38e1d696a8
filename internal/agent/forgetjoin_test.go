package agent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

func TestForgetJoin(t *testing.T) {
	id := identity.Identity{Cluster: "ci", NodeName: "ci-1", ProviderID: "socialweb://ci/ci-1", APIServer: "https://10.250.3.1:7500",
		CACert: "ca", ClientCACert: "cca", BootstrapToken: "abcdef.0123456789abcdef", Address: "10.250.3.2/24", Gateway: "10.250.3.1", DNS: "10.250.3.1", MaxPods: 110}
	var disk bytes.Buffer
	if err := identity.Encode(&disk, id); err != nil {
		t.Fatal(err)
	}
	withToken := disk.Bytes()
	without, _, err := identity.ForgetJoin(withToken)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		kubeconfig    bool // the kubelet has joined
		rewrittenRead int  // the read from which the host's rewrite shows; 0: never
		cancel        bool
		wantErr       string
		wantRemoved   bool
		wantFlush     bool
	}{
		{"the host rewrites the disk after a while", true, 3, false, "", true, true},
		{"already rewritten", true, 1, false, "", true, true},
		{"the host never does", true, 0, false, "did not rewrite", true, false},
		{"stopped while waiting", true, 0, true, "context canceled", true, false},
		{"not joined: the bootstrap stays", false, 1, false, "no kubeconfig of its own", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			boot, kc := filepath.Join(dir, "bootstrap-kubelet.conf"), filepath.Join(dir, "kubelet.conf")
			if err := os.WriteFile(boot, []byte("token: abcdef.0123456789abcdef"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.kubeconfig {
				if err := os.WriteFile(kc, []byte("cert"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var reads, flushes, flushedAfter atomic.Int32
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := joinForgetting{
				bootstrapKubeconfig: boot, kubeconfig: kc, poll: 5 * time.Millisecond, wait: 200 * time.Millisecond,
				read: func() ([]byte, error) {
					n := reads.Add(1)
					if tc.cancel && n == 2 {
						cancel()
					}
					if n == 1 && tc.rewrittenRead != 1 {
						return nil, errors.New("EIO") // a failed read is waited out too
					}
					if tc.rewrittenRead > 0 && int(n) >= tc.rewrittenRead {
						return without, nil
					}
					return withToken, nil
				},
				flush: func() error {
					flushes.Add(1)
					flushedAfter.Store(reads.Load())
					return nil
				},
			}
			err := forgetJoin(ctx, f)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			if _, err := os.Stat(boot); os.IsNotExist(err) != tc.wantRemoved {
				t.Errorf("bootstrap kubeconfig removed: %t, want %t", os.IsNotExist(err), tc.wantRemoved)
			}
			if got := flushes.Load() == 1; got != tc.wantFlush {
				t.Errorf("flushed %d times, want flushed: %t", flushes.Load(), tc.wantFlush)
			}
			if tc.wantFlush && int(flushedAfter.Load()) < tc.rewrittenRead {
				t.Errorf("flushed after read %d, before the rewrite showed (read %d): the cache would refill with the token", flushedAfter.Load(), tc.rewrittenRead)
			}
		})
	}
}
