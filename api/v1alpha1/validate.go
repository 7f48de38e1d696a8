package v1alpha1

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ValidateName says what is wrong with a cluster name and what would be right.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("a cluster name is required: use lowercase letters, digits and '-', e.g. ci-main")
	}
	if len(name) > MaxNameLength {
		return fmt.Errorf("cluster name %q is %d characters; at most %d are allowed (it prefixes node names, which must stay DNS labels)", name, len(name), MaxNameLength)
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("cluster name %q is not a DNS-1123 label: %s; use lowercase letters, digits and '-', starting and ending with a letter or digit, e.g. ci-main", name, strings.Join(errs, "; "))
	}
	return nil
}

// MaxNodeCPUs is the most vCPUs a node size may have (the CRD's bound).
const MaxNodeCPUs = 256

// ValidateNodeSizes says what is wrong with spec's node sizes and what would be accepted:
// no size is negative, and a maximum is at least its minimum. A field left 0 takes the
// daemon's default (which never contradicts one that is set) and is not compared. name
// gives a field's name in messages (nil: its JSON name), so the CLI can name its flags.
func ValidateNodeSizes(s ClusterSpec, name func(field string) string) error {
	if name == nil {
		name = func(f string) string { return f }
	}
	var errs []error
	for _, c := range []struct {
		field string
		v     int32
	}{{"nodeCPUs", s.NodeCPUs}, {"maxNodeCPUs", s.MaxNodeCPUs}} {
		if c.v < 0 || c.v > MaxNodeCPUs {
			errs = append(errs, fmt.Errorf("%s %d: want 1 to %d", name(c.field), c.v, MaxNodeCPUs))
		}
	}
	if s.NodeCPUs > 0 && s.MaxNodeCPUs > 0 && s.MaxNodeCPUs < s.NodeCPUs {
		errs = append(errs, fmt.Errorf("%s %d is below %s %d: want %s %d or more, or %s %d or fewer",
			name("maxNodeCPUs"), s.MaxNodeCPUs, name("nodeCPUs"), s.NodeCPUs, name("maxNodeCPUs"), s.NodeCPUs, name("nodeCPUs"), s.MaxNodeCPUs))
	}
	for _, q := range []struct {
		field   string
		v       resource.Quantity
		example string
	}{
		{"nodeMemory", s.NodeMemory, "2Gi"}, {"maxNodeMemory", s.MaxNodeMemory, "8Gi"},
		{"nodeDisk", s.NodeDisk, "10Gi"}, {"maxNodeDisk", s.MaxNodeDisk, "50Gi"},
	} {
		if q.v.Sign() < 0 {
			errs = append(errs, fmt.Errorf("%s %s: want a positive quantity such as %s", name(q.field), q.v.String(), q.example))
		}
	}
	for _, r := range []struct {
		lo, hi string
		l, h   resource.Quantity
	}{{"nodeMemory", "maxNodeMemory", s.NodeMemory, s.MaxNodeMemory}, {"nodeDisk", "maxNodeDisk", s.NodeDisk, s.MaxNodeDisk}} {
		if r.l.Sign() > 0 && r.h.Sign() > 0 && r.h.Cmp(r.l) < 0 {
			errs = append(errs, fmt.Errorf("%s %s is below %s %s: want %s %s or more, or %s %s or less",
				name(r.hi), r.h.String(), name(r.lo), r.l.String(), name(r.hi), r.l.String(), name(r.lo), r.h.String()))
		}
	}
	return errors.Join(errs...)
}

// ValidateSleepAfter says what is wrong with an idle time before sleep and what would be
// accepted: 0 (never) or at least MinSleepAfter. flag names it in the message.
func ValidateSleepAfter(flag string, d time.Duration) error {
	if d == 0 || d >= MinSleepAfter {
		return nil
	}
	return fmt.Errorf("%s %s: want 0 (never sleep) or %s or more, e.g. 15m", flag, d, MinSleepAfter)
}

// Bounds of the control plane's limits (ClusterSpec.ControlPlane*), the CRD's too.
const (
	MinControlPlaneMemory = "64Mi"
	MinControlPlanePIDs   = 64
	MaxControlPlanePIDs   = 4194304
	MaxControlPlaneWeight = 10000
)

// Egress values of ClusterSpec.Egress.
const (
	EgressHost = "host"
	EgressNone = "none"
)

// MaxEgressDeny caps ClusterSpec.EgressDeny: each CIDR is an element of the cluster's
// nftables set.
const MaxEgressDeny = 64

// ValidateEgress says what is wrong with spec's egress narrowing and what would be
// accepted. name gives a field's name in messages (nil: its JSON name).
func ValidateEgress(s ClusterSpec, name func(field string) string) error {
	if name == nil {
		name = func(f string) string { return f }
	}
	var errs []error
	switch s.Egress {
	case "", EgressHost, EgressNone:
	default:
		errs = append(errs, fmt.Errorf("%s %q: want host (the host's egress policy) or none (no forwarded traffic)", name("egress"), s.Egress))
	}
	if len(s.EgressDeny) > MaxEgressDeny {
		errs = append(errs, fmt.Errorf("%s: %d CIDRs, want at most %d", name("egressDeny"), len(s.EgressDeny), MaxEgressDeny))
	}
	for _, c := range s.EgressDeny {
		p, err := netip.ParsePrefix(c)
		switch {
		case err != nil || !p.Addr().Is4():
			errs = append(errs, fmt.Errorf("%s %q: want an IPv4 CIDR such as 192.168.10.0/24 (one address: 192.168.10.7/32)", name("egressDeny"), c))
		case p.Masked() != p:
			errs = append(errs, fmt.Errorf("%s %q has bits set past its length: want %s", name("egressDeny"), c, p.Masked()))
		}
	}
	return errors.Join(errs...)
}

// ValidateControlPlaneLimits says what is wrong with spec's control-plane limits and
// what would be accepted; a field left 0 takes the daemon's default. name gives a
// field's name in messages (nil: its JSON name).
func ValidateControlPlaneLimits(s ClusterSpec, name func(field string) string) error {
	if name == nil {
		name = func(f string) string { return f }
	}
	var errs []error
	if m := s.ControlPlaneMemory; m.Sign() != 0 && m.Cmp(resource.MustParse(MinControlPlaneMemory)) < 0 {
		errs = append(errs, fmt.Errorf("%s %s: want 0 (the daemon's default) or at least %s, e.g. 2Gi (an idle control plane holds about 300Mi)",
			name("controlPlaneMemory"), m.String(), MinControlPlaneMemory))
	}
	if p := s.ControlPlanePIDs; p != 0 && (p < MinControlPlanePIDs || p > MaxControlPlanePIDs) {
		errs = append(errs, fmt.Errorf("%s %d: want 0 (the daemon's default) or %d to %d", name("controlPlanePIDs"), p, MinControlPlanePIDs, MaxControlPlanePIDs))
	}
	if w := s.ControlPlaneCPUWeight; w < 0 || w > MaxControlPlaneWeight {
		errs = append(errs, fmt.Errorf("%s %d: want 1 to %d (100 is an ordinary process), or 0 for the daemon's default", name("controlPlaneCPUWeight"), w, MaxControlPlaneWeight))
	}
	return errors.Join(errs...)
}
