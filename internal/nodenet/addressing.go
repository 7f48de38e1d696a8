// Package nodenet owns each cluster's node network. This file is its
// addressing plan: a cluster's network lease index decides every subnet, so
// two clusters never overlap and a restart recomputes the same addresses.
package nodenet

import (
	"fmt"
	"net"
)

// MaxIndex bounds network indexes: pod CIDRs are 10.<index>.0.0/16 and must
// stay clear of the node (10.250/16) and service (10.251/16) ranges.
const MaxIndex = 199

// Plan is one cluster's addresses.
type Plan struct {
	Index       int
	Gateway     net.IP     // the host's address on the cluster bridge
	NodeCIDR    *net.IPNet // worker microVMs
	PodCIDR     *net.IPNet // split into per-node /24s by node IPAM
	ServiceCIDR *net.IPNet // virtual; the same shape in every cluster
	APIService  net.IP     // the `kubernetes` Service's ClusterIP
	DNSService  net.IP     // the cluster DNS Service's ClusterIP
}

// ForIndex computes the plan for a network lease index in [1, MaxIndex].
func ForIndex(i int) (Plan, error) {
	if i < 1 || i > MaxIndex {
		return Plan{}, fmt.Errorf("network index %d outside 1-%d", i, MaxIndex)
	}
	cidr := func(s string) *net.IPNet {
		_, n, _ := net.ParseCIDR(s)
		return n
	}
	return Plan{
		Index:       i,
		Gateway:     net.IPv4(10, 250, byte(i), 1).To4(),
		NodeCIDR:    cidr(fmt.Sprintf("10.250.%d.0/24", i)),
		PodCIDR:     cidr(fmt.Sprintf("10.%d.0.0/16", i)),
		ServiceCIDR: cidr("10.251.0.0/16"),
		APIService:  net.IPv4(10, 251, 0, 1).To4(),
		DNSService:  net.IPv4(10, 251, 0, 10).To4(),
	}, nil
}
