package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestHasVirtioDevice(t *testing.T) {
	tests := []struct {
		name    string
		devices map[string]string // virtioN -> contents of its device file
		want    bool
	}{
		{"no virtio bus", nil, false},
		{"block and net only", map[string]string{"virtio0": "0x0002\n", "virtio1": "0x0001\n"}, false},
		{"virtio-fs among others", map[string]string{"virtio0": "0x0002\n", "virtio3": "0x001a\n"}, true},
		{"unreadable entry ignored", map[string]string{"virtio0": "garbage\n", "virtio1": "0x001a"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bus := filepath.Join(t.TempDir(), "devices")
			for dev, id := range tt.devices {
				if err := os.MkdirAll(filepath.Join(bus, dev), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(bus, dev, "device"), []byte(id), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := hasVirtioDevice(bus, virtioFSDeviceID); got != tt.want {
				t.Errorf("hasVirtioDevice = %v, want %v", got, tt.want)
			}
		})
	}
}
