package v1alpha1

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		name    string
		wantErr string
	}{
		{"ci-main", ""},
		{"a", ""},
		{strings.Repeat("a", MaxNameLength), ""},
		{"", "required"},
		{strings.Repeat("a", MaxNameLength+1), "at most 40"},
		{"Bad_Name", "not a DNS-1123 label"},
		{"-lead", "not a DNS-1123 label"},
		{"trail-", "not a DNS-1123 label"},
		{"dot.ted", "not a DNS-1123 label"},
	}
	for _, tt := range tests {
		err := ValidateName(tt.name)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("ValidateName(%q) = %v, want nil", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("ValidateName(%q) = %v, want error containing %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestValidateNodeSizes(t *testing.T) {
	q := resource.MustParse
	flags := func(f string) string { return "--" + f }
	tests := []struct {
		name    string
		spec    ClusterSpec
		names   func(string) string
		wantErr string
	}{
		{"nothing set", ClusterSpec{}, nil, ""},
		{"a range", ClusterSpec{NodeCPUs: 1, MaxNodeCPUs: 8, NodeMemory: q("1Gi"), MaxNodeMemory: q("16Gi"), NodeDisk: q("10Gi"), MaxNodeDisk: q("50Gi")}, nil, ""},
		{"fixed", ClusterSpec{NodeCPUs: 2, MaxNodeCPUs: 2, NodeMemory: q("2Gi"), MaxNodeMemory: q("2048Mi")}, nil, ""},
		{"only maxima", ClusterSpec{MaxNodeCPUs: 4, MaxNodeMemory: q("8Gi"), MaxNodeDisk: q("20Gi")}, nil, ""},
		{"cpus min above max", ClusterSpec{NodeCPUs: 4, MaxNodeCPUs: 2}, nil, "maxNodeCPUs 2 is below nodeCPUs 4: want maxNodeCPUs 4 or more, or nodeCPUs 2 or fewer"},
		{"memory min above max", ClusterSpec{NodeMemory: q("4Gi"), MaxNodeMemory: q("2Gi")}, nil, "maxNodeMemory 2Gi is below nodeMemory 4Gi: want maxNodeMemory 4Gi or more, or nodeMemory 2Gi or less"},
		{"disk min above max, in flags", ClusterSpec{NodeDisk: q("20Gi"), MaxNodeDisk: q("10Gi")}, flags, "--maxNodeDisk 10Gi is below --nodeDisk 20Gi"},
		{"negative cpus", ClusterSpec{MaxNodeCPUs: -1}, nil, "maxNodeCPUs -1: want 1 to 256"},
		{"too many cpus", ClusterSpec{NodeCPUs: 1000}, nil, "nodeCPUs 1000: want 1 to 256"},
		{"negative memory", ClusterSpec{NodeMemory: q("-1Gi")}, nil, "nodeMemory -1Gi: want a positive quantity such as 2Gi"},
		{"negative disk", ClusterSpec{MaxNodeDisk: q("-5Gi")}, nil, "maxNodeDisk -5Gi: want a positive quantity such as 50Gi"},
	}
	for _, tt := range tests {
		err := ValidateNodeSizes(tt.spec, tt.names)
		if (err == nil) != (tt.wantErr == "") || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestValidateSleepAfter(t *testing.T) {
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{{0, true}, {30 * time.Second, true}, {time.Hour, true}, {29 * time.Second, false}, {time.Millisecond, false}, {-time.Minute, false}} {
		err := ValidateSleepAfter("--sleep-after", tc.d)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.d, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "want 0 (never sleep) or 30s or more") {
			t.Errorf("%s: %q does not say what is accepted", tc.d, err)
		}
	}
}

func TestValidateEgress(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spec    ClusterSpec
		wantErr string
	}{
		{"unset", ClusterSpec{}, ""},
		{"host", ClusterSpec{Egress: EgressHost}, ""},
		{"none with denies", ClusterSpec{Egress: EgressNone, EgressDeny: []string{"192.168.10.0/24", "203.0.113.7/32"}}, ""},
		{"an unknown mode", ClusterSpec{Egress: "internet"}, `egress "internet": want host`},
		{"an address with no length", ClusterSpec{EgressDeny: []string{"192.168.10.7"}}, "want an IPv4 CIDR"},
		{"IPv6", ClusterSpec{EgressDeny: []string{"fd00::/8"}}, "want an IPv4 CIDR"},
		{"bits past the length", ClusterSpec{EgressDeny: []string{"192.168.10.1/24"}}, "want 192.168.10.0/24"},
		{"too many", ClusterSpec{EgressDeny: make([]string, MaxEgressDeny+1)}, "want at most 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateEgress(tc.spec, nil)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
