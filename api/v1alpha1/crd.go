package v1alpha1

import (
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// sizeRule refuses a negative quantity in field.
func sizeRule(field string) apiextensionsv1.ValidationRule {
	return apiextensionsv1.ValidationRule{
		Rule:    fmt.Sprintf("!has(self.%[1]s) || !quantity(string(self.%[1]s)).isLessThan(quantity('0'))", field),
		Message: field + " must not be negative",
	}
}

// rangeRule refuses a maximum quantity below its minimum, unless either is 0 (unset).
func rangeRule(lo, hi string) apiextensionsv1.ValidationRule {
	return apiextensionsv1.ValidationRule{
		Rule: fmt.Sprintf("!has(self.%[1]s) || !has(self.%[2]s) || quantity(string(self.%[1]s)).compareTo(quantity('0')) == 0 || "+
			"quantity(string(self.%[2]s)).compareTo(quantity('0')) == 0 || !quantity(string(self.%[2]s)).isLessThan(quantity(string(self.%[1]s)))", lo, hi),
		Message: fmt.Sprintf("%s must be 0 (the same as %s) or at least %s", hi, lo, lo),
	}
}

// The idleSchedule grammar of window.Parse as an RE2 pattern (Go's regexp, which CEL
// runs too): DAYS HH:MM-HH:MM [ZONE], any whitespace (unicode.IsSpace, as strings.Fields
// splits) around and between. What it cannot say: whether ZONE is a zone the tz database
// knows (the scale driver reports a bad one on the Cluster, BadIdleSchedule), and that a
// span ends other than where it starts (idleScheduleSpan).
const (
	scheduleSpace = `[\t-\r\x{85}\p{Z}]`
	// ASCII letters in either case, as Parse takes them; not (?i), which also takes "ſun".
	scheduleDay     = `(?:[Mm][Oo][Nn]|[Tt][Uu][Ee]|[Ww][Ee][Dd]|[Tt][Hh][Uu]|[Ff][Rr][Ii]|[Ss][Aa][Tt]|[Ss][Uu][Nn])`
	scheduleDays    = scheduleDay + `(?:-` + scheduleDay + `)?(?:,` + scheduleDay + `(?:-` + scheduleDay + `)?)*`
	scheduleTime    = `(?:[01][0-9]|2[0-3]):[0-5][0-9]`
	scheduleSpan    = scheduleTime + `-(?:` + scheduleTime + `|24:00)`
	scheduleZone    = `[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+)*`
	scheduleExample = `e.g. "Mon-Fri 08:00-18:00 Europe/Berlin"`

	idleSchedulePattern = `^` + scheduleSpace + `*(?:` + scheduleDays + scheduleSpace + `+` + scheduleSpan +
		`(?:` + scheduleSpace + `+` + scheduleZone + `)?` + scheduleSpace + `*)?$`
	// idleScheduleSpan finds the span in a schedule the pattern matched: days have no
	// digits, a zone no colon.
	idleScheduleSpan = `[0-9]{2}:[0-9]{2}-[0-9]{2}:[0-9]{2}`
	// maxIdleSchedule bounds the field so the apiserver can bound the rules' cost; the
	// longest sensible schedule ("Mon,Tue,...,Sun 00:00-24:00 America/Argentina/...")
	// is under 80.
	maxIdleSchedule = 256
)

// idleScheduleRules refuse an idleSchedule window.Parse would. CEL rules rather than the
// schema's pattern: a pattern's error quotes the whole regex ("should match '^[\t-\r...'"),
// which says nothing to a person; a rule's message says the grammar and an example.
func idleScheduleRules() apiextensionsv1.ValidationRules {
	return apiextensionsv1.ValidationRules{
		{
			Rule: fmt.Sprintf("self.matches(r'%s')", idleSchedulePattern),
			Message: "idleSchedule must be DAYS HH:MM-HH:MM [ZONE]: DAYS a day (Mon), a range (Mon-Fri) or a comma list " +
				"(Mon,Wed,Fri-Sun); HH:MM from 00:00 to 23:59 (an end may be 24:00); ZONE an IANA name, UTC if left out; " +
				scheduleExample + ", or empty for always",
		},
		{
			// Past the first rule (whose message is the one to read), and not for an empty
			// schedule: it has no span.
			Rule: fmt.Sprintf("!self.matches(r'%[1]s') || self.find('%[2]s') == '' || self.find('%[2]s').substring(0, 5) != self.find('%[2]s').substring(6)",
				idleSchedulePattern, idleScheduleSpan),
			Message: "idleSchedule's span is empty (it ends where it starts): give an end other than the start, " +
				"e.g. 08:00-18:00, or 00:00-24:00 for the whole day",
		},
	}
}

// CRD returns the CustomResourceDefinition the daemon installs in the
// management API. The schema validates on the server too, so `kubectl apply`
// of a bad Cluster is refused the same way the CLI refuses it.
func CRD() *apiextensionsv1.CustomResourceDefinition {
	str := func(desc string) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "string", Description: desc}
	}
	intRange := func(desc string, min, max float64) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "integer", Format: "int32", Description: desc, Minimum: &min, Maximum: &max}
	}
	quantity := func(desc string) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{XIntOrString: true, AnyOf: []apiextensionsv1.JSONSchemaProps{{Type: "integer"}, {Type: "string"}}, Pattern: `^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$`, Description: desc}
	}
	schedule := str("weekly window for idleNodes, DAYS HH:MM-HH:MM [ZONE], e.g. Mon-Fri 08:00-18:00 Europe/Berlin; empty is always")
	schedule.MaxLength = ptr.To[int64](maxIdleSchedule)
	schedule.XValidations = idleScheduleRules()
	spec := apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"maxNodes":              intRange("cap on worker microVMs", 0, 1000),
			"hold":                  str("idle time before a node is removed, e.g. 1m"),
			"nodeCPUs":              intRange("vCPUs of the smallest worker microVM", 1, 256),
			"maxNodeCPUs":           intRange("vCPUs of the largest worker microVM; 0 is nodeCPUs", 0, 256),
			"nodeMemory":            quantity("memory of the smallest worker microVM, e.g. 2Gi"),
			"maxNodeMemory":         quantity("memory of the largest worker microVM, e.g. 8Gi; 0 is nodeMemory"),
			"nodeDisk":              quantity("container-storage disk of the smallest worker, e.g. 10Gi"),
			"maxNodeDisk":           quantity("container-storage disk of the largest worker, e.g. 50Gi; 0 is nodeDisk"),
			"podsPerNode":           intRange("max pods per worker", 1, 1000),
			"controlPlaneMemory":    quantity("memory cap of the control-plane process, e.g. 2Gi; 0 is the daemon's default"),
			"controlPlanePIDs":      intRange("cap on the control plane's threads and processes; 0 is the daemon's default", 0, 4194304),
			"controlPlaneCPUWeight": intRange("CPU share of the control plane, 1 to 10000 (100 is an ordinary process); 0 is the daemon's default", 0, 10000),
			"idleNodes":             intRange("joined, Ready nodes of the smallest size kept up with nothing on them", 0, 1000),
			"idleSchedule":          schedule,
			"egress": {Type: "string", Description: "narrows the host's egress policy for this cluster: host (the host's) or none (no forwarded traffic)",
				Enum: []apiextensionsv1.JSON{{Raw: []byte(`"host"`)}, {Raw: []byte(`"none"`)}}},
			"egressDeny": {Type: "array", Description: "IPv4 CIDRs this cluster's forwarded traffic may not reach, on top of the host's --egress-deny",
				MaxItems: ptr.To(int64(MaxEgressDeny)),
				// The pattern gives the shape; CEL's CIDR library what the pattern cannot:
				// octets, the length, and no bits past it (ValidateEgress, for kubectl).
				XValidations: apiextensionsv1.ValidationRules{{
					Rule:    "self.all(c, isCIDR(c) && cidr(c).ip().family() == 4 && cidr(c) == cidr(c).masked())",
					Message: "egressDeny: each entry must be an IPv4 network such as 192.168.10.0/24, with no bits set past its length",
				}},
				Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string",
					Pattern: `^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$`, MaxLength: ptr.To(int64(18))}}},
			"freshNodePerJob": {Type: "boolean", Description: "a node a CI job Pod ran on takes nothing after it and is removed when the job ends, without the hold"},
			"sleepAfter":      str("idle time before the control plane sleeps, e.g. 15m; 0 is never, at least 30s otherwise"),
			"datastore":       {Type: "string", Enum: []apiextensionsv1.JSON{{Raw: []byte(`"sqlite"`)}, {Raw: []byte(`"postgres"`)}}},
		},
		// What the CLI refuses (ValidateNodeSizes), refused for kubectl too. A field that
		// is absent or 0 takes the daemon's default, which never contradicts a set one.
		XValidations: apiextensionsv1.ValidationRules{
			{
				Rule:    "!has(self.maxNodeCPUs) || !has(self.nodeCPUs) || self.maxNodeCPUs == 0 || self.maxNodeCPUs >= self.nodeCPUs",
				Message: "maxNodeCPUs must be 0 (the same as nodeCPUs) or at least nodeCPUs",
			},
			sizeRule("nodeMemory"), sizeRule("maxNodeMemory"), sizeRule("nodeDisk"), sizeRule("maxNodeDisk"),
			{
				Rule:    "!has(self.sleepAfter) || duration(self.sleepAfter) == duration('0s') || duration(self.sleepAfter) >= duration('30s')",
				Message: "sleepAfter must be 0 (never) or at least 30s",
			},
			rangeRule("nodeMemory", "maxNodeMemory"), rangeRule("nodeDisk", "maxNodeDisk"),
			{
				Rule: "!has(self.controlPlaneMemory) || quantity(string(self.controlPlaneMemory)).compareTo(quantity('0')) == 0 || " +
					"!quantity(string(self.controlPlaneMemory)).isLessThan(quantity('" + MinControlPlaneMemory + "'))",
				Message: "controlPlaneMemory must be 0 (the daemon's default) or at least " + MinControlPlaneMemory,
			},
			{
				Rule:    "!has(self.controlPlanePIDs) || self.controlPlanePIDs == 0 || self.controlPlanePIDs >= " + fmt.Sprint(MinControlPlanePIDs),
				Message: fmt.Sprintf("controlPlanePIDs must be 0 (the daemon's default) or at least %d", MinControlPlanePIDs),
			},
		},
	}
	status := apiextensionsv1.JSONSchemaProps{
		Type:                   "object",
		XPreserveUnknownFields: ptr.To(true),
	}
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: Resource + "." + Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: Resource, Singular: "cluster", Kind: Kind, ListKind: Kind + "List",
			},
			Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: Version, Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Phase", Type: "string", JSONPath: ".status.phase"},
					{Name: "URL", Type: "string", JSONPath: ".status.url"},
					{Name: "Nodes", Type: "integer", JSONPath: ".status.nodes"},
					{Name: "Asleep-Since", Type: "date", JSONPath: ".status.asleepSince", Priority: 1},
					{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
				},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					XValidations: apiextensionsv1.ValidationRules{{
						Rule:    fmt.Sprintf("size(self.metadata.name) <= %d", MaxNameLength),
						Message: fmt.Sprintf("a cluster name is at most %d characters", MaxNameLength),
					}},
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"apiVersion": {Type: "string"},
						"kind":       {Type: "string"},
						"metadata":   {Type: "object"},
						"spec":       spec,
						"status":     status,
					},
				}},
			}},
		},
	}
}
