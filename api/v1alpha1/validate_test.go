package v1alpha1

import (
	"strings"
	"testing"
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
