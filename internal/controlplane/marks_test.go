package controlplane

import "testing"

func TestKubernetesService(t *testing.T) {
	tests := []struct {
		cidr    string
		wantIP  string
		wantErr bool
	}{
		{"10.251.0.0/16", "10.251.0.1", false},
		{"10.252.0.0/24", "10.252.0.1", false},
		{"10.251.7.9/16", "10.251.0.1", false},
		{"not-a-cidr", "", true},
	}
	for _, tt := range tests {
		svc, err := kubernetesService(Config{ServiceCIDR: tt.cidr, Port: 7690})
		if (err != nil) != tt.wantErr {
			t.Errorf("%s: err = %v, want error %v", tt.cidr, err, tt.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if svc.Spec.ClusterIP != tt.wantIP || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.IntValue() != 7690 || svc.Spec.Selector != nil {
			t.Errorf("%s: Service %+v, want ClusterIP %s, 443 -> 7690, no selector", tt.cidr, svc.Spec, tt.wantIP)
		}
	}
}
