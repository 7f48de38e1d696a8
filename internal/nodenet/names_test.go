package nodenet

import (
	"fmt"
	"net"
	"testing"
)

func TestNamesFitIFNAMSIZ(t *testing.T) {
	bridges := map[string]int{}
	for i := 1; i <= MaxIndex; i++ {
		br := BridgeName(i)
		if len(br) > IFNameMax || !bridgeRe.MatchString(br) || tapRe.MatchString(br) {
			t.Fatalf("bridge name %q: length %d or pattern wrong", br, len(br))
		}
		if j, dup := bridges[br]; dup {
			t.Fatalf("indexes %d and %d share bridge %s", i, j, br)
		}
		bridges[br] = i
		taps := map[string]string{}
		nodes := 500
		if i == MaxIndex {
			nodes = 20000
		}
		for n := range nodes {
			node := fmt.Sprintf("c%d-node-%d", i, n)
			tap := TapName(i, "cluster-with-a-long-name", node)
			if len(tap) > IFNameMax || !tapRe.MatchString(tap) || bridgeRe.MatchString(tap) {
				t.Fatalf("tap name %q (index %d): length %d or pattern wrong", tap, i, len(tap))
			}
			if other, dup := taps[tap]; dup {
				t.Fatalf("nodes %s and %s share tap %s", other, node, tap)
			}
			taps[tap] = node
		}
		if TapName(i, "a", "n1") != TapName(i, "a", "n1") || TapName(i, "a", "n1") == TapName(i, "b", "n1") {
			t.Fatal("tap names are not a function of (index, cluster, node)")
		}
	}
}

func TestNodeMAC(t *testing.T) {
	seen := map[string]string{}
	for n := range 5000 {
		node := fmt.Sprintf("node-%d", n)
		mac := NodeMAC("c1", node)
		if len(mac) != 6 || mac[0] != 0x02 {
			t.Fatalf("%s: MAC %s is not a locally administered unicast address", node, mac)
		}
		if !macEqual(mac, NodeMAC("c1", node)) {
			t.Fatalf("%s: MAC not stable", node)
		}
		if other, dup := seen[mac.String()]; dup {
			t.Fatalf("%s and %s share MAC %s", other, node, mac)
		}
		seen[mac.String()] = node
	}
	if macEqual(NodeMAC("c1", "n"), NodeMAC("c2", "n")) {
		t.Error("same node name in two clusters gets one MAC")
	}
	// Pinned: a changed derivation would give restarted nodes new MACs.
	if got := NodeMAC("c1", "node-0").String(); got != pinnedMAC {
		t.Errorf("NodeMAC(c1, node-0) = %s, want %s", got, pinnedMAC)
	}
}

const pinnedMAC = "02:43:1d:b6:1e:29"

func macEqual(a, b net.HardwareAddr) bool { return a.String() == b.String() }

func TestNodeAddressAndIPAM(t *testing.T) {
	p := plan(t, 7)
	for n, want := range map[int]string{2: "10.250.7.2", 254: "10.250.7.254", 100: "10.250.7.100"} {
		if got := NodeAddress(p, n); got.String() != want {
			t.Errorf("NodeAddress(%d) = %s, want %s", n, got, want)
		}
	}
	for _, bad := range []int{-1, 0, 1, 255, 256} {
		if got := NodeAddress(p, bad); got != nil {
			t.Errorf("NodeAddress(%d) = %s, want nil", bad, got)
		}
	}
	ipam := NodeIPAM{Plan: p}
	ips := func(s ...string) []net.IP {
		var out []net.IP
		for _, x := range s {
			out = append(out, net.ParseIP(x))
		}
		return out
	}
	for _, tc := range []struct {
		inUse []string
		want  string
	}{
		{nil, "10.250.7.2"},
		{[]string{"10.250.7.2", "10.250.7.3"}, "10.250.7.4"},
		{[]string{"10.250.7.3", "10.250.7.4"}, "10.250.7.2"},               // lowest free, not next after highest
		{[]string{"10.250.7.2", "10.250.7.4"}, "10.250.7.3"},               // a hole is reused
		{[]string{"10.250.8.2", "10.250.7.1", "192.0.2.2"}, "10.250.7.2"},  // others' addresses and the gateway don't count
		{[]string{"10.250.7.2", "10.250.7.2", "10.250.7.3"}, "10.250.7.4"}, // duplicates
	} {
		got, err := ipam.Next(ips(tc.inUse...))
		if err != nil || got.String() != tc.want {
			t.Errorf("Next(%v) = %v, %v; want %s", tc.inUse, got, err, tc.want)
		}
	}
	var all []net.IP
	for n := FirstNodeHost; n <= LastNodeHost; n++ {
		all = append(all, NodeAddress(p, n))
	}
	if got, err := ipam.Next(all); err == nil {
		t.Errorf("full subnet: got %s, want an error", got)
	}
	if got, err := ipam.Next(all[1:]); err != nil || got.String() != "10.250.7.2" {
		t.Errorf("one free: %v %v", got, err)
	}
}

func TestPoolNames(t *testing.T) {
	taps, macs := map[string]string{}, map[string]string{}
	for n := range 20000 {
		vm := fmt.Sprintf("pool-%d", n)
		tap, mac := PoolTapName(testOwner, vm), PoolMAC(vm)
		if len(tap) > IFNameMax || !poolTapRe.MatchString(tap) || tapRe.MatchString(tap) || bridgeRe.MatchString(tap) {
			t.Fatalf("pool tap name %q: length %d or pattern wrong", tap, len(tap))
		}
		if len(mac) != 6 || mac[0]&1 != 0 || mac[0]&2 == 0 || mac[0] == NodeMAC("c1", vm)[0] {
			t.Fatalf("%s: MAC %s is not a locally administered unicast address apart from NodeMAC's", vm, mac)
		}
		// 28 bits of the VM's name: the first 2000 names do not collide (a pool holds 16
		// VMs at most, and the provider refuses a name whose tap is in use).
		if other, dup := taps[tap]; dup && n < 2000 {
			t.Fatalf("VMs %s and %s share pool tap %s", other, vm, tap)
		}
		if other, dup := macs[mac.String()]; dup {
			t.Fatalf("VMs %s and %s share MAC %s", other, vm, mac)
		}
		taps[tap], macs[mac.String()] = vm, vm
	}
	// Pinned, like NodeMAC: a changed derivation would lose track of the taps of a
	// running pool.
	for _, tc := range []struct {
		name, got, want string
	}{
		{"PoolTapName stable", PoolTapName(testOwner, "pool-0"), PoolTapName(testOwner, "pool-0")},
		{"PoolMAC stable", PoolMAC("pool-0").String(), PoolMAC("pool-0").String()},
		{"PoolTapName pinned", PoolTapName(testOwner, "pool-0"), pinnedPoolTap},
		{"PoolTapOwner pinned", PoolTapOwner("/var/lib/socialweb"), pinnedPoolTapOwner},
		{"PoolMAC pinned", PoolMAC("pool-0").String(), pinnedPoolMAC},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, tc.got, tc.want)
		}
	}
}

const (
	pinnedPoolTap      = "swp0a1b-6c6afab"
	pinnedPoolTapOwner = "5a98"
	pinnedPoolMAC      = "06:29:35:40:c2:50"
)

// testOwner is a pool tap owner, as PoolTapOwner makes them.
const testOwner = "0a1b"
