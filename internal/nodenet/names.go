package nodenet

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
)

// IFNameMax is the longest Linux interface name (IFNAMSIZ 16 less the NUL).
const IFNameMax = 15

// Names of everything socialweb creates on the host. The prefixes are what
// List and orphan cleanup recognise, so nothing else may use them.
const (
	bridgePrefix  = "swb" // swb<index>
	tapPrefix     = "swt" // swt<index>-<8 hex>
	poolTapPrefix = "swp" // swp<4 hex owner>-<7 hex>: a warm-pool VM's tap, on no bridge until claimed
	tablePrefix   = "socialweb-"
	tableFamily   = "inet"
)

var (
	bridgeRe  = regexp.MustCompile(`^swb([0-9]{1,3})$`)
	tapRe     = regexp.MustCompile(`^swt([0-9]{1,3})-[0-9a-f]{8}$`)
	poolTapRe = regexp.MustCompile(`^swp([0-9a-f]{4})-[0-9a-f]{7}$`)
	// legacyPoolTapRe is the pool tap name before it carried its owner (swp-<8 hex>):
	// RemoveTap still takes it, for the records of VMs booted by an older daemon.
	legacyPoolTapRe = regexp.MustCompile(`^swp-[0-9a-f]{8}$`)
	poolTapOwnerRe  = regexp.MustCompile(`^[0-9a-f]{4}$`)
	tableRe         = regexp.MustCompile(`^socialweb-([0-9]{1,3})$`)
)

// BridgeName is the cluster bridge of a network index: swb<index>.
func BridgeName(index int) string { return bridgePrefix + strconv.Itoa(index) }

// TableName is the cluster's nftables table (family inet): socialweb-<index>.
func TableName(index int) string { return tablePrefix + strconv.Itoa(index) }

// TapName is the tap of one node: swt<index>-<first 8 hex digits of
// sha256(cluster/node)>, at most 15 characters. It carries the index so
// Remove finds every tap of a cluster, attached or not.
func TapName(index int, cluster, node string) string {
	sum := sha256.Sum256([]byte(cluster + "/" + node))
	return fmt.Sprintf("%s%d-%x", tapPrefix, index, sum[:4])
}

// NodeMAC is the guest NIC's MAC for a node: locally administered, unicast
// (first octet 0x02), the rest from sha256 of the cluster and node names, so
// a restarted node keeps its MAC (and its neighbours' ARP entries stay right).
func NodeMAC(cluster, node string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("mac:" + cluster + "/" + node))
	mac := net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}
	return mac
}

// PoolTapOwner is the owner part of a daemon's pool tap names: the first 4 hex digits of
// sha256 of its state directory (absolute). Pool taps are on no bridge, so no network
// index tells whose they are, and two daemons on one host (tests, a bench beside a
// serving daemon) each clean up only their own: a daemon that removed every pool tap on
// the host at start took the network from under another's waiting pool VMs (and their
// qemu then spun on the dead tap at 100% of a core).
func PoolTapOwner(stateDir string) string {
	if abs, err := filepath.Abs(stateDir); err == nil {
		stateDir = abs
	}
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return fmt.Sprintf("%x", sum[:2])
}

// PoolTapName is the tap of a warm-pool VM of owner (PoolTapOwner):
// swp<owner>-<first 7 hex digits of sha256(vm)>, 15 characters. It names no cluster:
// the VM belongs to none until ClaimTap renames the tap to its node's TapName.
func PoolTapName(owner, vm string) string {
	sum := sha256.Sum256([]byte(vm))
	return poolTapPrefix + owner + "-" + hex.EncodeToString(sum[:4])[:7]
}

// PoolMAC is the guest NIC's MAC for a warm-pool VM: locally administered, unicast,
// the rest from sha256 of the VM name. Its first octet is 0x06 where NodeMAC's is 0x02,
// so a pool VM never shares a MAC with a node booted for a cluster. A claimed VM keeps
// it (the NIC is fixed at boot): the identity written on claim names this MAC.
func PoolMAC(vm string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("poolmac:" + vm))
	return net.HardwareAddr{0x06, sum[0], sum[1], sum[2], sum[3], sum[4]}
}

// First and last host numbers a node may get in its cluster's NodeCIDR
// (.1 is the gateway, .255 the broadcast address).
const (
	FirstNodeHost = 2
	LastNodeHost  = 254
)

// NodeAddress is host number n (FirstNodeHost..LastNodeHost) in the plan's
// NodeCIDR, e.g. 10.250.<index>.<n>; nil when n is out of range.
func NodeAddress(plan Plan, n int) net.IP {
	if n < FirstNodeHost || n > LastNodeHost || plan.NodeCIDR == nil {
		return nil
	}
	base := plan.NodeCIDR.IP.To4()
	if base == nil {
		return nil
	}
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, binary.BigEndian.Uint32(base)|uint32(n))
	return ip
}

// nodeHost is the host number of ip in the plan's NodeCIDR, or 0.
func nodeHost(plan Plan, ip net.IP) int {
	ip4 := ip.To4()
	if ip4 == nil || plan.NodeCIDR == nil || !plan.NodeCIDR.Contains(ip4) {
		return 0
	}
	return int(ip4[3])
}

// NodeIPAM hands out node addresses. It holds no state: the caller passes
// the addresses in use (from its node records), so a restarted daemon
// computes the same answers.
type NodeIPAM struct{ Plan Plan }

// Next returns the lowest free node address, ignoring in-use addresses
// outside the cluster's NodeCIDR.
func (a NodeIPAM) Next(inUse []net.IP) (net.IP, error) {
	used := make(map[int]bool, len(inUse))
	for _, ip := range inUse {
		if h := nodeHost(a.Plan, ip); h != 0 {
			used[h] = true
		}
	}
	for n := FirstNodeHost; n <= LastNodeHost; n++ {
		if !used[n] {
			return NodeAddress(a.Plan, n), nil
		}
	}
	return nil, fmt.Errorf("node subnet %s of network index %d is full (%d nodes): remove a node first",
		a.Plan.NodeCIDR, a.Plan.Index, LastNodeHost-FirstNodeHost+1)
}
