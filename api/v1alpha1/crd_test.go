package v1alpha1

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // zones known whatever this host has installed, as in the daemon
	"unicode"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/common"

	"github.com/socialweb-computer/socialweb/internal/window"
)

// crdCheck validates Cluster objects as the apiserver does with CRD() installed.
type crdCheck struct {
	ss     *structuralschema.Structural
	rules  *cel.Validator
	schema apiservervalidation.SchemaValidator
}

// crdValidator validates CRD() as the apiserver does when the daemon installs it, and
// returns what the apiserver would say to a Cluster with spec: its schema (types,
// maxLength) and its rules, as the apiserver checks a create.
func crdValidator(t *testing.T) func(spec map[string]any) error {
	c := newCRDCheck(t)
	return func(spec map[string]any) error { return c.create(cluster(spec, nil)) }
}

func newCRDCheck(t *testing.T) crdCheck {
	t.Helper()
	crd := CRD()
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(crd)
	var internal apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(crd, &internal, nil); err != nil {
		t.Fatal(err)
	}
	if errs := validation.ValidateCustomResourceDefinition(context.Background(), &internal); len(errs) > 0 {
		t.Fatalf("the apiserver would refuse the CRD: %v", errs.ToAggregate())
	}
	ss, err := structuralschema.NewStructural(internal.Spec.Validation.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	schema, _, err := apiservervalidation.NewSchemaValidator(internal.Spec.Validation.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	return crdCheck{ss: ss, rules: cel.NewValidator(ss, true, celconfig.PerCallLimit), schema: schema}
}

// cluster is a Cluster object as the apiserver decodes it.
func cluster(spec, status map[string]any) map[string]any {
	obj := map[string]any{"apiVersion": Group + "/" + Version, "kind": Kind, "metadata": map[string]any{"name": "ci"}, "spec": spec}
	if status != nil {
		obj["status"] = status
	}
	return obj
}

// create is the apiserver's validation of a create: the schema, then the rules.
func (c crdCheck) create(obj map[string]any) error {
	errs := apiservervalidation.ValidateCustomResource(field.NewPath("root"), obj, c.schema)
	if len(errs) == 0 {
		errs, _ = c.rules.Validate(context.Background(), field.NewPath("root"), c.ss, obj, nil, celconfig.RuntimeCELCostBudget)
	}
	return errs.ToAggregate()
}

// statusUpdate is the rules' part of the apiserver's validation of a status write
// (customresource statusStrategy.ValidateUpdate): they run on the whole object, and a
// value unchanged since old is ratcheted (CRDValidationRatcheting, GA and locked on).
func (c crdCheck) statusUpdate(obj, old map[string]any) error {
	ratchet := cel.WithRatcheting(common.NewCorrelatedObject(obj, old, &model.Structural{Structural: c.ss}))
	errs, _ := c.rules.Validate(context.Background(), field.NewPath("root"), c.ss, obj, old, celconfig.RuntimeCELCostBudget, ratchet)
	return errs.ToAggregate()
}

// The daemon installs CRD() at every start; a schema or rule the apiserver refuses would
// stop it. Validate it as the apiserver does, then run its rules on Cluster specs.
func TestCRDRules(t *testing.T) {
	validate := crdValidator(t)
	tests := []struct {
		name    string
		spec    map[string]any
		wantErr string
	}{
		{"empty", map[string]any{}, ""},
		{"a range", map[string]any{"nodeCPUs": int64(1), "maxNodeCPUs": int64(8), "nodeMemory": "1Gi", "maxNodeMemory": "16Gi", "nodeDisk": "10Gi", "maxNodeDisk": "50Gi"}, ""},
		{"max 0 is the minimum", map[string]any{"nodeCPUs": int64(2), "maxNodeCPUs": int64(0), "nodeMemory": "2Gi", "maxNodeMemory": "0", "nodeDisk": "10Gi", "maxNodeDisk": "0"}, ""},
		{"only a max", map[string]any{"maxNodeCPUs": int64(4), "maxNodeMemory": "8Gi", "maxNodeDisk": "20Gi"}, ""},
		{"equal", map[string]any{"nodeMemory": "2048Mi", "maxNodeMemory": "2Gi"}, ""},
		{"memory as bytes", map[string]any{"nodeMemory": int64(1 << 30), "maxNodeMemory": "2Gi"}, ""},
		{"cpus below", map[string]any{"nodeCPUs": int64(4), "maxNodeCPUs": int64(2)}, "maxNodeCPUs must be 0 (the same as nodeCPUs) or at least nodeCPUs"},
		{"memory below", map[string]any{"nodeMemory": "4Gi", "maxNodeMemory": "2Gi"}, "maxNodeMemory must be 0 (the same as nodeMemory) or at least nodeMemory"},
		{"disk below", map[string]any{"nodeDisk": "20Gi", "maxNodeDisk": "10G"}, "maxNodeDisk must be 0 (the same as nodeDisk) or at least nodeDisk"},
		{"negative memory", map[string]any{"nodeMemory": "-1Gi"}, "nodeMemory must not be negative"},
		{"sleep never", map[string]any{"sleepAfter": "0s"}, ""},
		{"sleep after 30s", map[string]any{"sleepAfter": "30s"}, ""},
		{"sleep after 15m", map[string]any{"sleepAfter": "15m0s"}, ""},
		{"sleep too soon", map[string]any{"sleepAfter": "10s"}, "sleepAfter must be 0 (never) or at least 30s"},
		{"negative disk", map[string]any{"maxNodeDisk": "-10Gi"}, "maxNodeDisk must not be negative"},
		{"egress deny", map[string]any{"egressDeny": []any{"192.168.10.0/24", "203.0.113.7/32"}}, ""},
		{"egress deny, bits past the length", map[string]any{"egressDeny": []any{"192.168.10.1/24"}}, "no bits set past its length"},
		{"egress deny, an octet too big", map[string]any{"egressDeny": []any{"192.168.300.0/24"}}, "must be an IPv4 network"},
		{"egress deny, a length too long", map[string]any{"egressDeny": []any{"10.0.0.0/33"}}, "must be an IPv4 network"},
	}
	for _, tc := range tests {
		got := validate(tc.spec)
		switch {
		case tc.wantErr == "" && got != nil:
			t.Errorf("%s: refused: %v", tc.name, got)
		case tc.wantErr != "" && (got == nil || !strings.Contains(got.Error(), tc.wantErr)):
			t.Errorf("%s: %v, want %q", tc.name, got, tc.wantErr)
		}
	}
}

// The CRD takes exactly the idleSchedules window.Parse takes, so one applied with kubectl
// is refused where the CLI would refuse it, and the scale driver never finds one it cannot
// read. Where they differ, the row says why: a zone the tz database does not know (no
// pattern can know zones; the scale driver says so on the Cluster, BadIdleSchedule), or a
// schedule past maxLength (which bounds the rules' cost; no real one is that long).
func TestIdleScheduleAgreesWithParse(t *testing.T) {
	validate := crdValidator(t)
	pattern := regexp.MustCompile(idleSchedulePattern)
	const (
		grammar = "idleSchedule must be DAYS HH:MM-HH:MM [ZONE]"
		empty   = "idleSchedule's span is empty"
	)
	tests := []struct {
		schedule string
		parse    bool   // window.Parse takes it
		pattern  bool   // idleSchedulePattern matches it (Go's regexp, RE2 as in CEL)
		crd      string // what the CRD says: "" takes it
		differs  string // why Parse and the CRD disagree, when they do
	}{
		{"", true, true, "", ""},
		{"   ", true, true, "", ""},
		{"Mon-Fri 08:00-18:00", true, true, "", ""},
		{"Mon-Fri 08:00-18:00 Europe/Berlin", true, true, "", ""},
		{"Mon-Fri 08:00-18:00 UTC", true, true, "", ""},
		{"Mon-Fri 08:00-18:00 America/Argentina/Buenos_Aires", true, true, "", ""},
		{"Mon-Fri 08:00-18:00 America/Port-au-Prince", true, true, "", ""},
		{"Mon-Fri 08:00-18:00 Etc/GMT+5", true, true, "", ""},
		{"sat,sun 00:00-24:00", true, true, "", ""},
		{"MON-fRi 08:00-18:00", true, true, "", ""},
		{"Fri-Mon 10:00-11:00", true, true, "", ""},
		{"Mon,Wed,Fri-Sun 22:00-06:00", true, true, "", ""},
		{"Mon-Mon 00:00-00:01", true, true, "", ""},
		{" Mon-Fri\t08:00-18:00  UTC\n", true, true, "", ""},
		{"Mon-Fri\u00a008:00-18:00\u3000UTC", true, true, "", ""}, // Unicode spaces, as strings.Fields splits
		{"Mon-Fri 23:59-00:00", true, true, "", ""},

		{"weekdays 08:00-18:00", false, false, grammar, ""},
		{"Mon-Fri", false, false, grammar, ""},
		{"08:00-18:00", false, false, grammar, ""},
		{"Mon-Fri 8-18", false, false, grammar, ""},
		{"Mon-Fri 08:00", false, false, grammar, ""},
		{"Mon-Fri 8:00-18:00", false, false, grammar, ""},
		{"Mon-Fri 8:5xx-18:00", false, false, grammar, ""},
		{"Mon-Fri +8:00-18:00", false, false, grammar, ""},
		{"Mon-Fri 08:00-18:00-20:00", false, false, grammar, ""},
		{"Mon-Fri 08:00-25:00", false, false, grammar, ""},
		{"Mon-Fri 08:60-18:00", false, false, grammar, ""},
		{"Mon-Fri 24:00-08:00", false, false, grammar, ""},
		{"Mon-Fri 08:00-24:01", false, false, grammar, ""},
		{"Mon-Fri 08:00-18:00 UTC extra", false, false, grammar, ""},
		{"Mon,,Tue 08:00-18:00", false, false, grammar, ""},
		{"Mon, Tue 08:00-18:00", false, false, grammar, ""},
		{"Mon- 08:00-18:00", false, false, grammar, ""},
		{"Mon-Tue-Wed 08:00-18:00", false, false, grammar, ""},
		{"Monday 08:00-18:00", false, false, grammar, ""},
		{"FRİ 08:00-18:00", false, false, grammar, ""},
		{"ſun 08:00-18:00", false, false, grammar, ""},
		{"Mon\u200b08:00-18:00", false, false, grammar, ""}, // a zero-width space is no space
		{"Mon-Fri 08:00-18:00 ../etc/passwd", false, false, grammar, ""},
		{"Mon-Fri 08:00-18:00 /etc/localtime", false, false, grammar, ""},

		// What only the second rule sees: the pattern cannot compare two times.
		{"Mon-Fri 08:00-08:00", false, true, empty, ""},
		{"Mon-Fri 00:00-00:00 Europe/Berlin", false, true, empty, ""},

		{"Mon-Fri 08:00-18:00 Mars/Olympus", false, true, "", "unknown zone"},
		{"Mon-Fri 08:00-18:00 Europe/Berlinn", false, true, "", "unknown zone"},
		{"Mon-Fri 08:00-18:00 Not_A_Zone", false, true, "", "unknown zone"},
		{strings.Repeat("Mon,", 70) + "Tue 08:00-18:00", true, true, "Too long", "longer than maxLength"},
	}
	for _, tt := range tests {
		_, perr := window.Parse(tt.schedule)
		if got := perr == nil; got != tt.parse {
			t.Errorf("window.Parse(%q): %v, want taken %t", tt.schedule, perr, tt.parse)
		}
		if got := pattern.MatchString(tt.schedule); got != tt.pattern {
			t.Errorf("pattern matches %q: %t, want %t", tt.schedule, got, tt.pattern)
		}
		if disagree := tt.parse != (tt.crd == ""); disagree != (tt.differs != "") {
			t.Errorf("%q: Parse takes it %t, the CRD says %q, but the row says they differ for %q", tt.schedule, tt.parse, tt.crd, tt.differs)
		}
		err := validate(map[string]any{"idleNodes": int64(1), "idleSchedule": tt.schedule})
		switch {
		case tt.crd == "" && err != nil:
			t.Errorf("the CRD refuses %q: %v", tt.schedule, err)
		case tt.crd != "" && (err == nil || !strings.Contains(err.Error(), tt.crd)):
			t.Errorf("the CRD says %v to %q, want %q", err, tt.schedule, tt.crd)
		case err != nil && strings.Contains(err.Error(), "should match"):
			t.Errorf("the CRD's message for %q quotes the regex: %v", tt.schedule, err)
		case err != nil && tt.crd == grammar && !strings.Contains(err.Error(), `e.g. "Mon-Fri 08:00-18:00 Europe/Berlin"`):
			t.Errorf("the CRD's message for %q has no example: %v", tt.schedule, err)
		}
	}
}

// The pattern's whitespace is strings.Fields': every rune unicode.IsSpace says is one.
func TestIdleScheduleSpaceIsUnicodeSpace(t *testing.T) {
	space := regexp.MustCompile(`^` + scheduleSpace + `$`)
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xd800 && r <= 0xdfff {
			continue // surrogates are no runes in a Go string
		}
		if got, want := space.MatchString(string(r)), unicode.IsSpace(r); got != want {
			t.Errorf("U+%04X: the pattern's space %t, unicode.IsSpace %t", r, got, want)
		}
	}
}

// Every zone this host's tz database has matches the pattern's ZONE: a real zone is never
// refused by the CRD.
func TestIdleScheduleZonePatternTakesEveryZone(t *testing.T) {
	const dir = "/usr/share/zoneinfo"
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("no tz database at %s: %v", dir, err)
	}
	zone := regexp.MustCompile(`^` + scheduleZone + `$`)
	n := 0
	err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		name, _ := filepath.Rel(dir, path)
		if _, err := time.LoadLocation(name); err != nil {
			return nil // zone.tab, leapseconds and such: no zone
		}
		n++
		if !zone.MatchString(name) {
			t.Errorf("zone %q does not match the pattern's ZONE", name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 300 {
		t.Errorf("only %d zones under %s; want the tz database's 400 or more", n, dir)
	}
}

// A Cluster written before the idleSchedule rules (with a schedule they refuse) keeps
// taking status writes, the daemon's and the scale driver's BadIdleSchedule condition
// among them: the apiserver ratchets a rule on a value the write does not change. A write
// that changes the schedule must give a good one.
func TestIdleScheduleRulesSpareOldClusters(t *testing.T) {
	c := newCRDCheck(t)
	old := map[string]any{"idleNodes": int64(1), "idleSchedule": "Mon-Fri 8:00-18:00"}
	if c.create(cluster(old, nil)) == nil {
		t.Fatal("the rules take the old schedule: this test proves nothing")
	}
	status := map[string]any{"conditions": []any{map[string]any{
		"type": ConditionIdleSchedule, "status": "False", "reason": ReasonBadIdleSchedule, "message": "no idle nodes",
		"lastTransitionTime": "2026-12-07T12:00:00Z",
	}}}
	tests := []struct {
		name    string
		spec    map[string]any
		wantErr string
	}{
		{"a status write, the schedule as it was", old, ""},
		{"a status write that changes the schedule to another bad one", map[string]any{"idleNodes": int64(1), "idleSchedule": "Mon-Fri 9:00-18:00"}, "idleSchedule must be"},
		{"a status write that fixes the schedule", map[string]any{"idleNodes": int64(1), "idleSchedule": "Mon-Fri 08:00-18:00"}, ""},
	}
	for _, tt := range tests {
		err := c.statusUpdate(cluster(tt.spec, status), cluster(old, nil))
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: refused: %v", tt.name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}
