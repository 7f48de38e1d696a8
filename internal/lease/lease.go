// Package lease hands out the per-cluster resources that must not collide on
// one host: the apiserver port and the node-network index. A Table is a plain
// value; where it is stored (and how writers are serialised) is the caller's
// business.
package lease

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ErrExhausted is wrapped by Acquire when a range has no free slot.
var ErrExhausted = errors.New("lease range exhausted")

// Lease is what one cluster holds for its whole life.
type Lease struct {
	Port    int `json:"port"`
	Network int `json:"network"`
}

// Range is an inclusive range of integers.
type Range struct{ Lo, Hi int }

// ParseRange reads "6500-6599".
func ParseRange(s string) (Range, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		return Range{}, fmt.Errorf("range %q: want LOW-HIGH, e.g. 6500-6599", s)
	}
	l, err1 := strconv.Atoi(strings.TrimSpace(lo))
	h, err2 := strconv.Atoi(strings.TrimSpace(hi))
	if err1 != nil || err2 != nil {
		return Range{}, fmt.Errorf("range %q: both ends must be integers, e.g. 6500-6599", s)
	}
	if l < 1 || h > 65535 || l > h {
		return Range{}, fmt.Errorf("range %q: want 1 <= LOW <= HIGH <= 65535, e.g. 6500-6599", s)
	}
	return Range{Lo: l, Hi: h}, nil
}

func (r Range) String() string { return fmt.Sprintf("%d-%d", r.Lo, r.Hi) }

// Size is how many slots the range holds.
func (r Range) Size() int { return r.Hi - r.Lo + 1 }

// Table maps cluster name to its lease.
type Table map[string]Lease

// Acquire returns the cluster's lease, allocating the lowest free port and
// network if it has none. usable lets the caller skip a port something else
// on the host already listens on; nil means every port is usable. The table
// is changed only on success.
func (t Table) Acquire(cluster string, ports, networks Range, usable func(port int) bool) (Lease, error) {
	if l, ok := t[cluster]; ok {
		return l, nil
	}
	usedPorts, usedNets := map[int]bool{}, map[int]bool{}
	for _, l := range t {
		usedPorts[l.Port] = true
		usedNets[l.Network] = true
	}
	port := 0
	for p := ports.Lo; p <= ports.Hi; p++ {
		if !usedPorts[p] && (usable == nil || usable(p)) {
			port = p
			break
		}
	}
	if port == 0 {
		return Lease{}, fmt.Errorf("%w: no free apiserver port in %s (%d leased by %s); widen --port-range (SOCIALWEB_PORT_RANGE) or delete a cluster",
			ErrExhausted, ports, len(usedPorts), t.holders())
	}
	network := 0
	for n := networks.Lo; n <= networks.Hi; n++ {
		if !usedNets[n] {
			network = n
			break
		}
	}
	if network == 0 {
		return Lease{}, fmt.Errorf("%w: no free node network in %s; delete a cluster", ErrExhausted, networks)
	}
	l := Lease{Port: port, Network: network}
	t[cluster] = l
	return l, nil
}

// Release drops a cluster's lease; releasing twice is not an error.
func (t Table) Release(cluster string) { delete(t, cluster) }

func (t Table) holders() string {
	names := make([]string, 0, len(t))
	for n := range t {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) > 5 {
		names = append(names[:5], "...")
	}
	return strings.Join(names, ", ")
}
