package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// grafanaVars stand in for the dashboard's variables so that promtool can
// parse its queries; any other $ left over is a variable this test does not know.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$__interval", "1m",
	"$__range", "1h",
	"$cluster", ".*",
)

// dashboardRules writes the dashboard's queries as recording rules, the one
// way promtool 2.42 parses PromQL without a server.
func dashboardRules(t *testing.T) string {
	t.Helper()
	_, qs := readDashboard(t)
	var rules []rule
	for i, q := range qs {
		expr := grafanaVars.Replace(q.expr)
		if strings.Contains(expr, "$") {
			t.Fatalf("%s: unknown Grafana variable in %q", q.where, q.expr)
		}
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: expr})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPromtoolChecksTheRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		livetest.Skip(t, "promtool is not installed (Debian package prometheus; hack/deps installs it)")
	}
	if v, err := exec.Command(promtool, "--version").CombinedOutput(); err == nil {
		t.Logf("%s", strings.SplitN(string(v), "\n", 2)[0])
	}
	queries := dashboardRules(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"check alert rules", []string{"check", "rules", rulesFile}},
		{"unit tests of the alerts", []string{"test", "rules", ruleTestsFile}},
		{"dashboard queries parse", []string{"check", "rules", queries}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(promtool, tc.args...).CombinedOutput()
			if err != nil {
				t.Fatalf("promtool %s: %v\n%s", strings.Join(tc.args, " "), err, out)
			}
			t.Logf("promtool %s:\n%s", strings.Join(tc.args, " "), out)
		})
	}
}
