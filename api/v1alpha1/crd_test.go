package v1alpha1

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

// The daemon installs CRD() at every start; a schema or rule the apiserver refuses would
// stop it. Validate it as the apiserver does, then run its rules on Cluster specs.
func TestCRDRules(t *testing.T) {
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
	v := cel.NewValidator(ss, true, celconfig.PerCallLimit)

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
		obj := map[string]any{"apiVersion": Group + "/" + Version, "kind": Kind, "metadata": map[string]any{"name": "ci"}, "spec": tc.spec}
		errs, _ := v.Validate(context.Background(), field.NewPath("root"), ss, obj, nil, celconfig.RuntimeCELCostBudget)
		got := errs.ToAggregate()
		switch {
		case tc.wantErr == "" && got != nil:
			t.Errorf("%s: refused: %v", tc.name, got)
		case tc.wantErr != "" && (got == nil || !strings.Contains(got.Error(), tc.wantErr)):
			t.Errorf("%s: %v, want %q", tc.name, got, tc.wantErr)
		}
	}
}
