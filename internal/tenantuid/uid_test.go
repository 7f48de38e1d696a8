package tenantuid

import "testing"

func TestFor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		base    int64
		port    int
		want    Owner
		wantErr bool
	}{
		{"root when the base is 0", 0, 7500, Owner{}, false},
		{"root ignores the port", 0, 0, Owner{}, false},
		{"default base", DefaultBase, 7500, Owner{2_000_007_500, 2_000_007_500}, false},
		{"lowest base", MinBase, 1, Owner{MinBase + 1, MinBase + 1}, false},
		{"highest base and port", maxID - maxPort, maxPort, Owner{maxID, maxID}, false},
		{"base past the top", maxID - maxPort + 1, 1, Owner{}, true},
		{"base among ordinary users", 1000, 7500, Owner{}, true},
		{"negative base", -1, 7500, Owner{}, true},
		{"port 0", DefaultBase, 0, Owner{}, true},
		{"port past 65535", DefaultBase, 65536, Owner{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := For(tc.base, tc.port)
			if (err != nil) != tc.wantErr {
				t.Fatalf("For(%d, %d) error %v, want error %v", tc.base, tc.port, err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("For(%d, %d) = %+v, want %+v", tc.base, tc.port, got, tc.want)
			}
			if err == nil && got.Root() != (tc.base == 0) {
				t.Errorf("For(%d, %d).Root() = %v", tc.base, tc.port, got.Root())
			}
		})
	}
}
