// Package nodehealth is a node's own view of its network: can it reach the cluster's
// gateway, and does its cluster DNS answer. The agent probes both and keeps the answers
// as conditions on its Node (True means a problem, as node-problem-detector's do); the
// scale driver sums them up on the Cluster. A node is never left silently broken.
package nodehealth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/socialweb-computer/socialweb/internal/dnswire"
)

// Condition types a node sets on itself. True means the problem is present.
const (
	GatewayUnreachable    corev1.NodeConditionType = "GatewayUnreachable"
	ClusterDNSUnavailable corev1.NodeConditionType = "ClusterDNSUnavailable"
)

// Types are all the condition types of this package, in a fixed order.
var Types = []corev1.NodeConditionType{GatewayUnreachable, ClusterDNSUnavailable}

// Result is one probe's outcome: Err nil means healthy.
type Result struct {
	Type corev1.NodeConditionType
	Err  error
}

// Conditions turns probe results into Node conditions. A condition whose status did not
// change keeps its transition time from prev.
func Conditions(prev []corev1.NodeCondition, results []Result, now time.Time) []corev1.NodeCondition {
	out := make([]corev1.NodeCondition, 0, len(results))
	for _, r := range results {
		c := corev1.NodeCondition{Type: r.Type, Status: corev1.ConditionFalse, LastHeartbeatTime: metav1.NewTime(now),
			LastTransitionTime: metav1.NewTime(now)}
		switch r.Type {
		case GatewayUnreachable:
			c.Reason, c.Message = "GatewayReachable", "the node reaches the cluster's gateway"
		case ClusterDNSUnavailable:
			c.Reason, c.Message = "ClusterDNSAnswers", "the node's cluster DNS server answers"
		}
		if r.Err != nil {
			c.Status, c.Reason, c.Message = corev1.ConditionTrue, string(r.Type), r.Err.Error()
		}
		for _, p := range prev {
			if p.Type == c.Type && p.Status == c.Status {
				c.LastTransitionTime = p.LastTransitionTime
			}
		}
		out = append(out, c)
	}
	return out
}

// Changed says whether next differs from prev in anything but heartbeat times.
func Changed(prev, next []corev1.NodeCondition) bool {
	for _, n := range next {
		i := slices.IndexFunc(prev, func(p corev1.NodeCondition) bool { return p.Type == n.Type })
		if i < 0 || prev[i].Status != n.Status || prev[i].Reason != n.Reason || prev[i].Message != n.Message {
			return true
		}
	}
	return false
}

// Problems lists, one line per node and condition, the nodes that report a problem
// ("node n1: GatewayUnreachable: ..."), sorted. Empty means every node is healthy.
func Problems(nodes []*corev1.Node) []string {
	var out []string
	for _, n := range nodes {
		for _, c := range n.Status.Conditions {
			if slices.Contains(Types, c.Type) && c.Status == corev1.ConditionTrue {
				out = append(out, fmt.Sprintf("node %s: %s: %s", n.Name, c.Type, c.Message))
			}
		}
	}
	slices.Sort(out)
	return out
}

// Prober probes a node's network.
type Prober struct {
	// Gateway is an address on the gateway that answers TCP (the tenant apiserver).
	Gateway string
	// ClusterDNS is the node's cluster DNS server (host:port); Name is a name it must
	// answer with at least one address (the kubernetes Service always exists).
	ClusterDNS, Name string
	Timeout          time.Duration
}

// Probe runs every probe once.
func (p Prober) Probe(ctx context.Context) []Result {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	gw := func() error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", p.Gateway)
		if err != nil {
			return fmt.Errorf("cannot reach the gateway at %s: %w", p.Gateway, err)
		}
		return c.Close()
	}()
	dns := func() error {
		ips, err := LookupA(ctx, p.ClusterDNS, p.Name)
		if err != nil {
			return fmt.Errorf("cluster DNS at %s: %s: %w", p.ClusterDNS, p.Name, err)
		}
		if len(ips) == 0 {
			return fmt.Errorf("cluster DNS at %s has no address for %s", p.ClusterDNS, p.Name)
		}
		return nil
	}()
	return []Result{{GatewayUnreachable, gw}, {ClusterDNSUnavailable, dns}}
}

// LookupA asks server (host:port) over UDP for name's A records.
func LookupA(ctx context.Context, server, name string) ([]net.IP, error) {
	qname, err := dnsmessage.NewName(dnsFQDN(name))
	if err != nil {
		return nil, err
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: uint16(time.Now().UnixNano()), RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(dnsmessage.Question{Name: qname, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		return nil, err
	}
	query, err := b.Finish()
	if err != nil {
		return nil, err
	}
	timeout := 3 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	resp, err := dnswire.Exchange(ctx, "udp", server, query, timeout)
	if err != nil {
		return nil, err
	}
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		return nil, err
	}
	if h.RCode == dnsmessage.RCodeNameError {
		return nil, errors.New("no such name (NXDOMAIN)")
	}
	if h.RCode != dnsmessage.RCodeSuccess {
		return nil, fmt.Errorf("answer %s", h.RCode)
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, err
	}
	var ips []net.IP
	for {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			return ips, nil
		}
		if err != nil {
			return nil, err
		}
		if rh.Type != dnsmessage.TypeA {
			if err := p.SkipAnswer(); err != nil {
				return nil, err
			}
			continue
		}
		a, err := p.AResource()
		if err != nil {
			return nil, err
		}
		ips = append(ips, net.IP(a.A[:]))
	}
}

func dnsFQDN(name string) string {
	if strings.HasSuffix(name, ".") {
		return name
	}
	return name + "."
}

// Run probes every interval and patches the node's conditions when they change (and at
// least every refresh, so a stale report shows in its heartbeat time). The first patch is
// made after the first probe.
func Run(ctx context.Context, client kubernetes.Interface, node string, p Prober, interval, refresh time.Duration, log *slog.Logger) {
	var (
		last     []corev1.NodeCondition
		lastSent time.Time
	)
	for {
		next := Conditions(last, p.Probe(ctx), time.Now())
		if last == nil || Changed(last, next) || time.Since(lastSent) >= refresh {
			if err := patchConditions(ctx, client, node, next); err != nil {
				log.Warn("node health: patching the Node's conditions", "err", err)
			} else {
				for _, c := range next {
					if c.Status == corev1.ConditionTrue {
						log.Warn("node health: problem", "condition", c.Type, "message", c.Message)
					}
				}
				last, lastSent = next, time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// patchConditions merges conds into the Node's status conditions (a strategic merge on
// type, so the kubelet's own conditions are left alone).
func patchConditions(ctx context.Context, client kubernetes.Interface, node string, conds []corev1.NodeCondition) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": conds}})
	if err != nil {
		return err
	}
	_, err = client.CoreV1().Nodes().PatchStatus(ctx, node, patch)
	return err
}
