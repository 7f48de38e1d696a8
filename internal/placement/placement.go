// Package placement decides which host runs a tenant's control plane. It is a
// pure function of what the hosts reported (free memory, tenants, limits), so
// every host computes the same answer from the same view, and the tenant's
// Lease, not this package, settles a race between two views.
package placement

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Host is what placement knows of one host.
type Host struct {
	Name string
	// Live: its Lease is fresh. A host that stopped renewing gets nothing.
	Live bool
	// Draining: `host drain` asked for its tenants to move; it gets nothing.
	Draining bool
	// FreeMemory is the memory it has left, in bytes, as it last reported.
	FreeMemory int64
	// Tenants is how many tenants it owns, the ones placed in this pass included.
	Tenants int
	// MaxTenants caps Tenants (--max-tenants); 0 is no cap.
	MaxTenants int
}

// Decision is where a tenant goes and why, in words put on its Cluster.
type Decision struct {
	Host   string
	Reason string
}

// ErrNoHost: no host may take the tenant now. The error says why of each.
var ErrNoHost = errors.New("no host can take the tenant")

// TenantReserve is the memory counted for each tenant a host owns on top of
// what it reports free: a sleeping tenant uses none now but wakes there, so a
// host full of sleepers is not as free as it looks. About one awake control
// plane's resident memory (docs/benchmarks.md: 309-324 MiB).
const TenantReserve = 384 << 20

// Decide picks, of the live hosts that are not draining and are under their
// cap, the one with the most memory after its tenants' reserve; ties go to
// fewer tenants, then to the name, so every host picks the same one.
func Decide(hosts []Host) (Decision, error) {
	var ok []Host
	var refused []string
	for _, h := range hosts {
		switch {
		case !h.Live:
			refused = append(refused, h.Name+": its Lease lapsed")
		case h.Draining:
			refused = append(refused, h.Name+": draining")
		case h.MaxTenants > 0 && h.Tenants >= h.MaxTenants:
			refused = append(refused, fmt.Sprintf("%s: %d tenants, its --max-tenants", h.Name, h.Tenants))
		default:
			ok = append(ok, h)
		}
	}
	if len(ok) == 0 {
		if len(hosts) == 0 {
			return Decision{}, fmt.Errorf("%w: no host has registered (is `socialweb serve` running?)", ErrNoHost)
		}
		slices.Sort(refused)
		return Decision{}, fmt.Errorf("%w: %s; add a host, raise --max-tenants or delete a tenant", ErrNoHost, strings.Join(refused, "; "))
	}
	slices.SortFunc(ok, func(a, b Host) int {
		return cmp.Or(cmp.Compare(room(b), room(a)), cmp.Compare(a.Tenants, b.Tenants), cmp.Compare(a.Name, b.Name))
	})
	best := ok[0]
	reason := fmt.Sprintf("placed on %s: %d MiB free less %d MiB for its %d tenants", best.Name, best.FreeMemory>>20, int64(best.Tenants)*TenantReserve>>20, best.Tenants)
	if len(ok) > 1 {
		reason += fmt.Sprintf(", the most of %d hosts", len(ok))
	} else {
		reason += ", the only host that can take it"
	}
	return Decision{Host: best.Name, Reason: reason}, nil
}

// room is what a host has left for one more tenant.
func room(h Host) int64 { return h.FreeMemory - int64(h.Tenants)*TenantReserve }

// WakeMargin is how much more room another host must have before a sleeping
// tenant wakes there rather than on its own host: half a tenant's reserve,
// so that two hosts about as free (their reports differ by a few MiB) do not
// pass a tenant back and forth at every wake.
const WakeMargin = TenantReserve / 2

// Rewake decides where a sleeping tenant of host current wakes: on current,
// unless current cannot take it (its Lease lapsed, it drains, it is over its
// cap without the tenant) or another host that may take one more tenant has
// WakeMargin more room than current has without it. moved says it goes.
func Rewake(hosts []Host, current string) (d Decision, moved bool, err error) {
	others := make([]Host, 0, len(hosts))
	var cur Host
	found := false
	for _, h := range hosts {
		if h.Name == current {
			cur, found = h, true
			continue
		}
		others = append(others, h)
	}
	if found && cur.Tenants > 0 {
		cur.Tenants-- // it counts there now; it is the one placed
	}
	stay := found && cur.Live && !cur.Draining && (cur.MaxTenants == 0 || cur.Tenants < cur.MaxTenants)
	best, err := Decide(others)
	switch {
	case err != nil && stay:
		return Decision{Host: current, Reason: "wakes on " + current + ", its host: no other host can take it"}, false, nil
	case err != nil:
		return Decision{}, false, err
	case stay && room(best.host(others)) < room(cur)+WakeMargin:
		return Decision{Host: current, Reason: fmt.Sprintf("wakes on %s, its host: %d MiB of room, and no other host has %d MiB more",
			current, room(cur)>>20, int64(WakeMargin)>>20)}, false, nil
	}
	why := "its host " + current + " cannot take it"
	if stay {
		why = fmt.Sprintf("%s has %d MiB more room than its host %s", best.Host, (room(best.host(others))-room(cur))>>20, current)
	}
	return Decision{Host: best.Host, Reason: "wakes on " + best.Host + ": " + why}, true, nil
}

// host is the decision's host among hosts.
func (d Decision) host(hosts []Host) Host {
	for _, h := range hosts {
		if h.Name == d.Host {
			return h
		}
	}
	return Host{}
}
