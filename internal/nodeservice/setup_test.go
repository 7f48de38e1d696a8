package nodeservice

import (
	"context"
	"log/slog"
	"strings"
	"testing"
)

// Start's early answers, which boot nothing (a node image's provider is the live tests').
func TestStartWithoutTheMachinery(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		wantStand bool
		wantErr   string
	}{
		{name: "no node image: the stand-in", cfg: Config{StateDir: t.TempDir()}, wantStand: true},
		{name: "a node image without the node network", cfg: Config{StateDir: t.TempDir(), NodeImage: "/nonexistent"}, wantErr: "--node-image needs --node-network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := Start(context.Background(), tc.cfg, Deps{Log: slog.New(slog.DiscardHandler)})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Start = %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := ns.(*noNodeImage); ok != tc.wantStand {
				t.Errorf("Start = %T", ns)
			}
		})
	}
}
