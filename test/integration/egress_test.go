package integration

import (
	"context"
	"encoding/json"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
)

// TestClusterEgressNarrowing: a Cluster narrows the host's egress policy for its own
// bridge, and an edit of a running cluster reaches its rules: `egress: none` turns the
// last forward verdict into a refusal, `egressDeny` fills the deny set. A value the
// CRD refuses changes nothing. (The traffic itself is attacked by nodenet's
// TestLiveEgressWalls, with the same rules.)
func TestClusterEgressNarrowing(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		livetest.Skip(t, "nft not installed: apt-get install nftables")
	}
	d := newDaemon(t, 1)
	d.start()
	d.mustCLI("cluster", "create", "narrow", "--wait", "--node-egress-deny", "198.51.100.0/24")
	var c v1.Cluster
	if err := json.Unmarshal([]byte(d.mustCLI("cluster", "get", "narrow", "-o", "json")), &c); err != nil {
		t.Fatal(err)
	}
	nodes, err := netip.ParsePrefix(c.Status.NodeCIDR)
	if err != nil {
		t.Fatalf("the cluster's node CIDR %q: %v", c.Status.NodeCIDR, err)
	}
	table := nodenet.TableName(int(nodes.Addr().As4()[2])) // 10.250.N.0/24 is network N
	rules := func() string {
		out, err := exec.Command("nft", "list", "table", "inet", table).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list table inet %s: %v\n%s", table, err, out)
		}
		return string(out)
	}
	closed := `counter name "egress_denied" reject with icmpx admin-prohibited` + "\n\t\toifname"
	if r := rules(); !strings.Contains(r, "198.51.100.0/24") || strings.Contains(r, closed) {
		t.Fatalf("created with --node-egress-deny 198.51.100.0/24: want it in the deny set and the internet open:\n%s", r)
	}
	if !strings.Contains(d.mustCLI("cluster", "get", "narrow"), "also denied: 198.51.100.0/24") {
		t.Errorf("cluster get does not show the cluster's egress deny")
	}

	// The operator edits the Cluster through the management API, as kubectl would.
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(d.stateDir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	clusters := dynamic.NewForConfigOrDie(cfg).Resource(v1.ClusterResource)
	patch := func(p string) error {
		_, err := clusters.Patch(context.Background(), "narrow", types.MergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}
	if err := patch(`{"spec":{"egressDeny":["198.51.100.1/24"]}}`); err == nil || !strings.Contains(err.Error(), "no bits set past its length") {
		t.Errorf("a deny with bits past its length: %v; want the CRD's refusal", err)
	}
	if err := patch(`{"spec":{"egress":"none","egressDeny":null}}`); err != nil {
		t.Fatalf("patching egress none: %v", err)
	}
	livetest.Eventually(t, time.Minute, time.Second, "egress none in the cluster's rules", func() bool {
		r := rules()
		return strings.Contains(r, closed) && !strings.Contains(r, "198.51.100.0/24")
	})
}
