package nodenet

import "testing"

func TestPlansNeverOverlap(t *testing.T) {
	seen := map[string]int{}
	for i := 1; i <= MaxIndex; i++ {
		p, err := ForIndex(i)
		if err != nil {
			t.Fatal(err)
		}
		if !p.NodeCIDR.Contains(p.Gateway) {
			t.Errorf("index %d: gateway %s outside %s", i, p.Gateway, p.NodeCIDR)
		}
		for _, n := range []string{p.NodeCIDR.String(), p.PodCIDR.String()} {
			if j, dup := seen[n]; dup {
				t.Errorf("index %d reuses %s of index %d", i, n, j)
			}
			seen[n] = i
		}
		if p.PodCIDR.Contains(p.Gateway) || p.PodCIDR.Contains(p.APIService) || p.ServiceCIDR.Contains(p.Gateway) {
			t.Errorf("index %d: pod, node and service ranges overlap", i)
		}
	}
	for _, bad := range []int{0, -1, MaxIndex + 1} {
		if _, err := ForIndex(bad); err == nil {
			t.Errorf("ForIndex(%d) accepted", bad)
		}
	}
}
