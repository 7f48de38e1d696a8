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

// Lease is what one cluster holds. The port is held for the cluster's whole
// life (clients and the front door know it); the node network only while the
// cluster can have nodes: a sleeping cluster gives it back, so a host can
// register many more tenants than it has node networks.
type Lease struct {
	Port int `json:"port"`
	// Network is the node-network index; 0 while the cluster holds none.
	Network int `json:"network"`
}

// HasNetwork reports whether the lease holds a node network.
func (l Lease) HasNetwork() bool { return l.Network != 0 }

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
// network it lacks: both for a new cluster, the network alone for one that
// released it (ReleaseNetwork). usable lets the caller skip a port something
// else on the host already listens on; nil means every port is usable. The
// table is changed only on success.
func (t Table) Acquire(cluster string, ports, networks Range, usable func(port int) bool) (Lease, error) {
	cur := t[cluster] // the zero Lease for a new cluster
	if cur.HasNetwork() {
		return cur, nil
	}
	usedPorts, usedNets := map[int]bool{}, t.Networks()
	for _, l := range t {
		usedPorts[l.Port] = true
	}
	port := cur.Port
	for p := ports.Lo; p <= ports.Hi && port == 0; p++ {
		if !usedPorts[p] && (usable == nil || usable(p)) {
			port = p
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
		return Lease{}, fmt.Errorf("%w: no free node network in %s (%d held by clusters that are awake or have nodes); delete a cluster or let one sleep",
			ErrExhausted, networks, len(usedNets))
	}
	l := Lease{Port: port, Network: network}
	t[cluster] = l
	return l, nil
}

// ReleaseNetwork gives back a cluster's node network and keeps its port.
// Releasing what is not held is not an error.
func (t Table) ReleaseNetwork(cluster string) {
	if l, ok := t[cluster]; ok {
		l.Network = 0
		t[cluster] = l
	}
}

// Networks reports which node-network indexes are held.
func (t Table) Networks() map[int]bool {
	held := map[int]bool{}
	for _, l := range t {
		if l.HasNetwork() {
			held[l.Network] = true
		}
	}
	return held
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
