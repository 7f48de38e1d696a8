package main

import (
	"fmt"
	"io"
	"time"
)

// cell is one table value: a number for the ratio column, or text only.
type cell struct {
	text string
	v    float64
	ok   bool
}

func num(format string, v float64) cell { return cell{text: fmt.Sprintf(format, v), v: v, ok: true} }
func text(s string) cell                { return cell{text: s} }
func dur(d time.Duration) cell {
	if d == 0 {
		return text("n/a")
	}
	return num("%.2fs", d.Seconds())
}

// rows are the table's figures for one mode, in row order.
func rows(r report) []cell {
	lat := func(p float64) cell {
		if len(r.latencies) == 0 {
			return text("n/a")
		}
		return dur(percentile(r.latencies, p))
	}
	perSleeping := text("n/a")
	if r.mode == "sleep" && r.asleep > 0 {
		perSleeping = num("%.2f", r.perSleeping)
	}
	awakeEach := text("n/a")
	switch {
	case r.mode == "sleep" && r.awakeEach > 0:
		awakeEach = num("%.0f", r.awakeEach)
	case r.mode == "awake":
		awakeEach = num("%.0f", r.perTenant)
	}
	stop := "reached -tenants"
	if r.stopReason != "" {
		stop = r.stopReason
	}
	next := dur(r.next)
	if r.nextName != "" {
		next.text += " (" + r.nextName + ")"
	}
	errs := fmt.Sprintf("%d of %d", len(r.latencies), len(r.latencies)+r.latencyErrs)
	asleepProcs := text("n/a")
	if r.mode == "sleep" && r.asleep > 0 {
		asleepProcs = text(fmt.Sprintf("%d (%.0f MiB)", r.asleepProcs, r.asleepPss))
	}
	return []cell{
		num("%.0f", float64(r.held)),
		text(fmt.Sprintf("%d / %d", r.awake, r.asleep)),
		text(stop),
		num("%.0f", r.baseline),
		num("%.0f", r.total),
		text(fmt.Sprintf("%.0f → %.0f", r.alone.daemon, r.with.daemon)),
		text(fmt.Sprintf("%.0f → %.0f", r.alone.mgmt, r.with.mgmt)),
		awakeEach,
		asleepProcs,
		perSleeping,
		num("%.2f", r.perTenant),
		lat(50),
		lat(99),
		text(errs),
		dur(median(r.creates)),
		next,
	}
}

// rowNames label rows() in order.
func rowNames() []string {
	return []string{
		"tenants held (N)",
		"awake / asleep when measured",
		"creating stopped because",
		"PSS, daemon alone before any tenant (MiB)",
		"PSS, daemon + all descendants with N tenants (MiB)",
		"of which the daemon process, alone → with N (MiB)",
		"of which the management API, alone → with N (MiB)",
		"PSS per awake tenant (MiB; sleep: mean of the kept-awake tenants' processes, same run; awake: (total − alone)/N)",
		"processes of sleeping tenants (their PSS)",
		"memory per sleeping tenant (MiB) = (total − alone − PSS of every awake tenant's processes) / asleep",
		"memory per tenant, simple (MiB) = (total − alone) / N",
		"first request p50 (connect start → first response byte, pod list; awake: awake tenants, sleep: sleeping tenants, i.e. wake latency)",
		"first request p99",
		"first requests answered",
		"create → Ready median while filling",
		"create → Ready of tenant N+1 (sleep) / of the last tenant held (awake)",
	}
}

// printTable prints one markdown table with a column per mode and, with both
// modes, the ratio awake/sleep where both are numbers.
func printTable(w io.Writer, o options, reports []report, command string) {
	fmt.Fprintf(w, "\n%d tenants requested, %d kept awake in sleep mode, --default-sleep-after %s, creates %d at a time\n\n", o.tenants, o.awake, o.sleepAfter, o.concurrency)
	fmt.Fprint(w, "| figure |")
	for _, r := range reports {
		fmt.Fprintf(w, " %s |", r.mode)
	}
	both := len(reports) == 2
	if both {
		fmt.Fprint(w, " awake / sleep |")
	}
	fmt.Fprint(w, "\n|---|")
	for range reports {
		fmt.Fprint(w, "---|")
	}
	if both {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	cols := make([][]cell, len(reports))
	for i, r := range reports {
		cols[i] = rows(r)
	}
	for j, name := range rowNames() {
		fmt.Fprintf(w, "| %s |", name)
		for i := range reports {
			fmt.Fprintf(w, " %s |", cols[i][j].text)
		}
		if both {
			a, s := cols[0][j], cols[1][j]
			if a.ok && s.ok && s.v != 0 {
				fmt.Fprintf(w, " %.2f |", a.v/s.v)
			} else {
				fmt.Fprint(w, " |")
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\ncommand: %s\n", command)
}
