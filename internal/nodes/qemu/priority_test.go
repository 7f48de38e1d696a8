package qemu

import "testing"

func TestStatNice(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       int
		wantErr    bool
	}{
		{"qemu", "4242 (qemu-system-x86) S 1 4242 4242 0 -1 4194560 1 0 0 0 5 3 0 0 30 10 7 0 100 0 0\n", 10, false},
		{"a command with spaces and parentheses", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 -5 1 0 1 0 0", -5, false},
		{"no command", "4242 qemu S 1", 0, true},
		{"cut short", "4242 (qemu) S 1 2 3", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := statNice([]byte(tc.stat))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("statNice = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
