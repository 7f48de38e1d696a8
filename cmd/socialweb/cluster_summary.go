package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

// keyWidth is where a summary's values start: past its longest key,
// "Pod starts (last hour):".
const keyWidth = 25

// clusterSummary is what `cluster get NAME` prints: one Cluster for a person,
// its ages and times taken at now.
func clusterSummary(c *v1.Cluster, now time.Time) string { return summarize(c, now, false) }

// clusterSummaryWide is `cluster get NAME -o wide`: the summary and then the whole
// of each condition message the table cut to its first line (NodeBoot carries a
// node's console lines).
func clusterSummaryWide(c *v1.Cluster, now time.Time) string { return summarize(c, now, true) }

func summarize(c *v1.Cluster, now time.Time, wide bool) string {
	var b strings.Builder
	st := &c.Status
	s := newSpecText(c)
	field := func(indent int, key, value string) { writeField(&b, indent, key, value) }

	field(0, "Name", c.Name)
	field(0, "Phase", orNone(string(st.Phase)))
	field(0, "URL", orNone(st.URL))
	port := "<none>"
	if st.Port != 0 {
		port = strconv.Itoa(int(st.Port))
	}
	field(0, "Port", port)
	// The node network is given back while the cluster sleeps; say so, not just <none>.
	network := func(v string) string {
		if v == "" && st.Phase == v1.PhaseAsleep {
			return "<none while asleep>"
		}
		return orNone(v)
	}
	field(0, "Gateway", network(st.Gateway))
	field(0, "Node CIDR", network(st.NodeCIDR))
	field(0, "Pod CIDR", network(st.PodCIDR))
	field(0, "Service CIDR", network(st.ServiceCIDR))
	field(0, "Created", when(c.CreationTimestamp, now))
	if c.DeletionTimestamp != nil {
		field(0, "Deleting since", when(*c.DeletionTimestamp, now))
	}

	b.WriteString("Spec:\n")
	disk := s.disk() + " disk"
	if s.disk() == "none" {
		disk = "no disk"
	}
	field(2, "Node size", fmt.Sprintf("%s vCPU, %s memory, %s", s.cpus(), s.memory(), disk))
	field(2, "Max nodes", s.maxNodes())
	field(2, "Pods per node", s.podsPerNode())
	field(2, "Hold", s.hold())
	field(2, "Idle nodes", s.idleNodes())
	field(2, "Fresh node per job", yesNo(c.Spec.FreshNodePerJob))
	field(2, "Egress", egressSummary(c.Spec))
	field(2, "Sleep after", s.sleepAfter())
	field(2, "Datastore", s.datastore())
	field(2, "Control plane", s.controlPlane())

	field(0, "Nodes", strconv.Itoa(int(st.Nodes)))
	if in := st.IdleNodes; in != nil {
		field(0, "Idle nodes", fmt.Sprintf("wanted %d, spare %d (%d joined, %d booting), %d claimed", in.Wanted, in.Spare, in.Spare-in.Booting, in.Booting, in.Claimed))
	}
	field(0, "Accelerator", accelerator(st.Conditions))
	if d := st.LastScaleDecision; d == nil {
		field(0, "Last scale decision", "<none>")
	} else {
		b.WriteString("Last scale decision:\n")
		field(2, "Action", d.Action)
		field(2, "Target", plural(int(d.Target), "node"))
		field(2, "Reason", d.Reason)
		field(2, "When", when(d.Time, now))
	}
	if st.AsleepSince != nil {
		field(0, "Asleep since", when(*st.AsleepSince, now))
	}
	if st.NextWake != nil {
		field(0, "Next wake", when(*st.NextWake, now))
	}
	field(0, "Restarts", strconv.Itoa(int(st.Restarts)))
	field(0, "Pod starts (last hour)", podStarts(st.PodStarts))
	more := "-o wide"
	if wide {
		more = "below"
	}
	writeConditions(&b, st.Conditions, now, more)
	if wide {
		for _, cond := range st.Conditions {
			if !strings.Contains(strings.TrimSpace(cond.Message), "\n") {
				continue
			}
			fmt.Fprintf(&b, "%s message:\n", cond.Type)
			for _, l := range strings.Split(strings.TrimSpace(cond.Message), "\n") {
				fmt.Fprintf(&b, "  %s\n", l)
			}
		}
	}
	return b.String()
}

// writeField writes "key: value" with the value at keyWidth, and lines after
// a value's first under it.
func writeField(b *strings.Builder, indent int, key, value string) {
	pad := strings.Repeat(" ", indent)
	lines := strings.Split(strings.TrimRight(value, "\n"), "\n")
	fmt.Fprintf(b, "%s%-*s%s\n", pad, keyWidth-indent, key+":", lines[0])
	for _, l := range lines[1:] {
		fmt.Fprintf(b, "%s%s\n", strings.Repeat(" ", keyWidth), l)
	}
}

// writeConditions writes the conditions as a table, each message cut to its
// first line; more says where the rest is.
func writeConditions(b *strings.Builder, conds []metav1.Condition, now time.Time, more string) {
	if len(conds) == 0 {
		writeField(b, 0, "Conditions", "<none>")
		return
	}
	b.WriteString("Conditions:\n")
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
	for _, c := range conds {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, orNone(c.Reason), age(c.LastTransitionTime.Time, now), firstLine(c.Message, more))
	}
	_ = tw.Flush() // a strings.Builder does not fail
}

// firstLine is a message's first line, saying how many more there are and where.
// Its tabs become spaces: they would split the table's columns.
func firstLine(msg, more string) string {
	lines := strings.Split(strings.ReplaceAll(strings.TrimSpace(msg), "\t", " "), "\n")
	if len(lines) == 1 {
		return lines[0]
	}
	return fmt.Sprintf("%s (%d more lines: %s)", lines[0], len(lines)-1, more)
}

// accelerator is what the NodeAccelerator condition says: KVM or TCG, and why.
func accelerator(conds []metav1.Condition) string {
	c := meta.FindStatusCondition(conds, v1.ConditionNodeAccelerator)
	switch {
	case c == nil:
		return "<not reported yet>"
	case c.Message == "":
		return c.Reason
	default:
		return c.Reason + " (" + strings.Split(strings.TrimSpace(c.Message), "\n")[0] + ")"
	}
}

// podStarts is status.podStarts on one line: "idle n=3 p50 4.1s p90 6.0s, cold n=1 ...".
func podStarts(ps []v1.PodStartPercentiles) string {
	if len(ps) == 0 {
		return "none recorded"
	}
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s n=%d p50 %.1fs p90 %.1fs", p.Path, p.Count, p.P50.Seconds(), p.P90.Seconds()))
	}
	return strings.Join(parts, ", ")
}

// when is a time and how far it is from now: "2026-05-01T10:00:00Z (3m ago)", or "(in 3m)".
func when(t metav1.Time, now time.Time) string {
	rel := age(t.Time, now) + " ago"
	if t.After(now) {
		rel = "in " + age(now, t.Time)
	}
	return t.UTC().Format(time.RFC3339) + " (" + rel + ")"
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// specText prints a spec's values. Until the daemon has filled a new Cluster's
// defaults (in the update that adds its finalizer) a zero means "the daemon's
// default"; after, a zero is what it says: no disk, never asleep, no limit.
type specText struct {
	s         *v1.ClusterSpec
	defaulted bool
}

func newSpecText(c *v1.Cluster) specText {
	return specText{s: &c.Spec, defaulted: slices.Contains(c.Finalizers, v1.Finalizer)}
}

// zero is how a zero value reads: its meaning, or "default" before the daemon filled it.
func (t specText) zero(meaning string) string {
	if t.defaulted {
		return meaning
	}
	return "default"
}

// span is "lo-hi", or lo alone when the range is one size.
func span(lo, hi string) string {
	if hi == "" || hi == lo {
		return lo
	}
	return lo + "-" + hi
}

func (t specText) int32(v int32, meaning string) string {
	if v == 0 {
		return t.zero(meaning)
	}
	return strconv.Itoa(int(v))
}

func (t specText) cpus() string {
	if t.s.NodeCPUs == 0 && t.s.MaxNodeCPUs == 0 {
		return t.zero("0")
	}
	hi := ""
	if t.s.MaxNodeCPUs != 0 {
		hi = strconv.Itoa(int(t.s.MaxNodeCPUs))
	}
	return span(strconv.Itoa(int(t.s.NodeCPUs)), hi)
}

// quantities is a minimum and maximum; none is how both zero read once defaulted.
func (t specText) quantities(lo, hi resource.Quantity, none string) string {
	if lo.IsZero() && hi.IsZero() {
		return t.zero(none)
	}
	h := ""
	if !hi.IsZero() {
		h = hi.String()
	}
	return span(lo.String(), h)
}

func (t specText) memory() string { return t.quantities(t.s.NodeMemory, t.s.MaxNodeMemory, "0") }

func (t specText) disk() string { return t.quantities(t.s.NodeDisk, t.s.MaxNodeDisk, "none") }

func (t specText) maxNodes() string { return t.int32(t.s.MaxNodes, "0") }

func (t specText) podsPerNode() string { return t.int32(t.s.PodsPerNode, "0") }

func (t specText) hold() string {
	if t.s.Hold.Duration == 0 {
		return t.zero("0s")
	}
	return shortDuration(t.s.Hold.Duration)
}

// idleNodes is spec.idleNodes and when they are kept: "2 (Mon-Fri 08:00-18:00 UTC)".
func (t specText) idleNodes() string {
	switch {
	case t.s.IdleNodes == 0:
		return "none"
	case t.s.IdleSchedule == "":
		return fmt.Sprintf("%d (always)", t.s.IdleNodes)
	default:
		return fmt.Sprintf("%d (%s)", t.s.IdleNodes, t.s.IdleSchedule)
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (t specText) sleepAfter() string {
	switch {
	case t.s.SleepAfter == nil:
		return t.zero("never")
	case t.s.SleepAfter.Duration == 0:
		return "never"
	default:
		return shortDuration(t.s.SleepAfter.Duration)
	}
}

func (t specText) datastore() string {
	if t.s.Datastore == "" {
		return t.zero("<none>")
	}
	return t.s.Datastore
}

func (t specText) controlPlane() string {
	mem := t.zero("no limit")
	if !t.s.ControlPlaneMemory.IsZero() {
		mem = t.s.ControlPlaneMemory.String()
	}
	return fmt.Sprintf("memory %s, pids %s, cpu weight %s", mem,
		t.int32(t.s.ControlPlanePIDs, "no limit"), t.int32(t.s.ControlPlaneCPUWeight, "default"))
}

// shortDuration drops a Duration's zero tail: 1m, not 1m0s; 2h, not 2h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// egressSummary says how the cluster narrows the host's egress policy.
func egressSummary(s v1.ClusterSpec) string {
	out := "the host's policy"
	if s.Egress == v1.EgressNone {
		out = "none (nothing forwarded)"
	}
	if len(s.EgressDeny) > 0 {
		out += "; also denied: " + strings.Join(s.EgressDeny, ", ")
	}
	return out
}
