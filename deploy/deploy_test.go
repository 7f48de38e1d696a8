package deploy

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	rulesFile     = "prometheus/socialweb-alerts.yaml"
	ruleTestsFile = "prometheus/socialweb-alerts_test.yaml"
	dashboardFile = "grafana/socialweb-dashboard.json"
	sourceRoot    = "../internal"
)

// metricKind says which series names a metric has in PromQL.
type metricKind int

const (
	plain     metricKind = iota // the name itself
	histogram                   // name_bucket, name_sum, name_count; no bare name
	summary                     // the name (quantiles), name_sum, name_count
)

// scanMetrics finds the metric names the Go code under root declares: the
// Name of a prometheus CounterOpts, GaugeOpts, HistogramOpts or SummaryOpts
// literal, and the first argument of prometheus.NewDesc. Test files are left
// out: a name only a test declares is not exported.
func scanMetrics(root string) (map[string]metricKind, error) {
	kinds := map[string]metricKind{"CounterOpts": plain, "GaugeOpts": plain, "HistogramOpts": histogram, "SummaryOpts": summary}
	found := map[string]metricKind{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				kind, ok := kinds[sel.Sel.Name]
				if !ok {
					return true
				}
				for _, e := range n.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					if key, ok := kv.Key.(*ast.Ident); ok && key.Name == "Name" {
						if name, ok := stringLit(kv.Value); ok {
							found[name] = kind
						}
					}
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if ok && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
					if name, ok := stringLit(n.Args[0]); ok {
						found[name] = plain
					}
				}
			}
			return true
		})
		return nil
	})
	return found, err
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// exported is what the daemon's code declares.
func exported(t *testing.T) map[string]metricKind {
	t.Helper()
	got, err := scanMetrics(sourceRoot)
	if err != nil {
		t.Fatalf("scanning %s: %v", sourceRoot, err)
	}
	if len(got) < 10 {
		t.Fatalf("found only %d metrics under %s: is the scan still right?", len(got), sourceRoot)
	}
	return got
}

var metricRe = regexp.MustCompile(`\bsocialweb_[a-z0-9_]+\b`)

// metricNames are the socialweb series an expression names, sorted, once each.
func metricNames(expr string) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range metricRe.FindAllString(expr, -1) {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out
}

// resolve says why a series name is not one of the metrics in known.
func resolve(series string, known map[string]metricKind) error {
	if kind, ok := known[series]; ok {
		if kind == histogram {
			return fmt.Errorf("%s is a histogram: query %s_bucket, _sum or _count", series, series)
		}
		return nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(series, suffix)
		if !ok {
			continue
		}
		kind, ok := known[base]
		if ok && (kind == histogram || (kind == summary && suffix != "_bucket")) {
			return nil
		}
	}
	return fmt.Errorf("%s: no metric of that name under internal/", series)
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`socialweb_nodes > 0`, []string{"socialweb_nodes"}},
		{`sum by (le) (rate(socialweb_cluster_wake_seconds_bucket[5m]))`, []string{"socialweb_cluster_wake_seconds_bucket"}},
		{`x_socialweb_nodes + socialweb_nodes`, []string{"socialweb_nodes"}},
		{`rate(socialweb_a_total[5m]) / rate(socialweb_b_total[5m]) or socialweb_a_total`, []string{"socialweb_a_total", "socialweb_b_total"}},
		{`up == 0`, nil},
	} {
		if got := metricNames(tc.expr); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("metricNames(%q) = %v, want %v", tc.expr, got, tc.want)
		}
	}
}

func TestResolve(t *testing.T) {
	known := map[string]metricKind{"socialweb_nodes": plain, "socialweb_wait_seconds": histogram, "socialweb_q_seconds": summary}
	for _, tc := range []struct {
		series string
		ok     bool
	}{
		{"socialweb_nodes", true},
		{"socialweb_wait_seconds_bucket", true},
		{"socialweb_wait_seconds_sum", true},
		{"socialweb_wait_seconds_count", true},
		{"socialweb_wait_seconds", false}, // a classic histogram has no bare series
		{"socialweb_q_seconds", true},
		{"socialweb_q_seconds_count", true},
		{"socialweb_q_seconds_bucket", false},
		{"socialweb_nodes_bucket", false},
		{"socialweb_nodes_total", false},
		{"socialweb_missing", false},
	} {
		if err := resolve(tc.series, known); (err == nil) != tc.ok {
			t.Errorf("resolve(%s) = %v, want ok=%v", tc.series, err, tc.ok)
		}
	}
}

func TestScanMetrics(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a/m.go": `package a
var c = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "socialweb_c_total", Help: "h"}, nil)
var h = prometheus.NewHistogram(prometheus.HistogramOpts{Help: "h", Name: "socialweb_h_seconds"})
var d = prometheus.NewDesc("socialweb_d", "h", nil, nil)
var other = struct{ Name string }{Name: "socialweb_not_a_metric"}
`,
		"a/m_test.go": `package a
var t = prometheus.NewGauge(prometheus.GaugeOpts{Name: "socialweb_test_only"})
`,
	}
	for name, src := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := scanMetrics(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]metricKind{"socialweb_c_total": plain, "socialweb_h_seconds": histogram, "socialweb_d": plain}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("scanMetrics = %v, want %v", got, want)
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rf
}

// checkExpr fails t for an expression that names no socialweb metric or one
// the daemon does not export.
func checkExpr(t *testing.T, where, expr string, known map[string]metricKind) {
	t.Helper()
	names := metricNames(expr)
	if len(names) == 0 {
		t.Errorf("%s: names no socialweb_ metric: %q", where, expr)
	}
	for _, n := range names {
		if err := resolve(n, known); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
}

func TestAlertRulesUseExportedMetrics(t *testing.T) {
	known := exported(t)
	rf := readRules(t)
	seen := map[string]bool{}
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			n++
			where := g.Name + "/" + r.Alert
			if r.Alert == "" {
				t.Errorf("%s: a rule without an alert name", g.Name)
			}
			if seen[r.Alert] {
				t.Errorf("%s: alert name used twice", where)
			}
			seen[r.Alert] = true
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("%s: severity %q, want critical, warning or info", where, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: wants a summary and a description (what to do next)", where)
			}
			checkExpr(t, where, r.Expr, known)
		}
	}
	if n == 0 {
		t.Fatalf("%s has no rules", rulesFile)
	}
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int     `json:"id"`
	Type       string  `json:"type"`
	Title      string  `json:"title"`
	Datasource *dsRef  `json:"datasource"`
	Panels     []panel `json:"panels"` // a collapsed row's
	Targets    []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource *dsRef `json:"datasource"`
	} `json:"targets"`
}

type dashboard struct {
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			Datasource *dsRef          `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

// dashboardQuery is one panel target's PromQL.
type dashboardQuery struct {
	where, expr string
}

func readDashboard(t *testing.T) (dashboard, []dashboardQuery) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []dashboardQuery
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				qs = append(qs, dashboardQuery{fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID), tg.Expr})
			}
		}
	}
	walk(d.Panels)
	return d, qs
}

const dsVar = "${DS_PROMETHEUS}"

func TestDashboardUsesExportedMetrics(t *testing.T) {
	known := exported(t)
	d, qs := readDashboard(t)
	if d.UID == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, schemaVersion %d: want a uid and a schema of Grafana 9.4 or later", d.UID, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Name == "cluster" {
			if !strings.Contains(string(v.Query), "label_values(socialweb_nodes, cluster)") {
				t.Errorf("cluster variable query %s, want label_values(socialweb_nodes, cluster)", v.Query)
			}
			if v.Datasource == nil || v.Datasource.UID != dsVar {
				t.Errorf("cluster variable datasource %+v, want uid %s", v.Datasource, dsVar)
			}
			checkExpr(t, "variable cluster", v.Definition, known)
		}
	}
	if vars["DS_PROMETHEUS"] != "datasource" || vars["cluster"] != "query" {
		t.Errorf("variables %v, want DS_PROMETHEUS (datasource) and cluster (query)", vars)
	}
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != dsVar {
				t.Errorf("panel %q: datasource %+v, want uid %s", p.Title, p.Datasource, dsVar)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no targets", p.Title)
			}
		}
	}
	walk(d.Panels)
	if len(qs) == 0 {
		t.Fatalf("%s has no queries", dashboardFile)
	}
	for _, q := range qs {
		checkExpr(t, q.where, q.expr, known)
	}
}
