package nodes

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

func TestNewNodeName(t *testing.T) {
	dnsLabel := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	seen := map[string]bool{}
	for range 20000 {
		n, err := NewNodeName("liveweb")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(n, "liveweb-") || len(n) != len("liveweb-")+suffixLen || !dnsLabel.MatchString(n) {
			t.Fatalf("bad name %q", n)
		}
		if seen[n] {
			t.Fatalf("name %q reused", n)
		}
		seen[n] = true
	}
	for _, bad := range []string{"", strings.Repeat("c", 60)} {
		if n, err := NewNodeName(bad); err == nil {
			t.Errorf("NewNodeName(%q) = %q, want an error", bad, n)
		}
	}
}

func TestProviderID(t *testing.T) {
	if got := ProviderID("liveweb", "liveweb-node1"); got != "socialweb://liveweb/liveweb-node1" {
		t.Errorf("ProviderID = %q", got)
	}
	tests := []struct {
		id            string
		cluster, node string
		ok            bool
	}{
		{"socialweb://liveweb/liveweb-node1", "liveweb", "liveweb-node1", true},
		{"aws://liveweb/x", "", "", false},
		{"socialweb://liveweb", "", "", false},
		{"socialweb:///x", "", "", false},
		{"socialweb://c/", "", "", false},
		{"socialweb://c/a/b", "", "", false},
	}
	for _, tc := range tests {
		c, n, err := ParseProviderID(tc.id)
		if (err == nil) != tc.ok || c != tc.cluster || n != tc.node {
			t.Errorf("ParseProviderID(%q) = %q, %q, %v", tc.id, c, n, err)
		}
	}
}

func TestIsNotFound(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{NewNotFound("x"), true},
		{fmt.Errorf("delete: %w", NewNotFound("x")), true},
		{errors.Join(errors.New("a"), NewNotFound("x")), true},
		{errors.New("node \"x\" not found"), false},
		{nil, false},
	}
	for _, tc := range tests {
		if got := IsNotFound(tc.err); got != tc.want {
			t.Errorf("IsNotFound(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}

func TestNodeRequestValidate(t *testing.T) {
	good := NodeRequest{Cluster: "c", Name: "c-x", CPUs: 1, MemoryMiB: 512, MaxPods: 10}
	tests := []struct {
		name string
		mod  func(*NodeRequest)
		ok   bool
	}{
		{"good", func(*NodeRequest) {}, true},
		{"no cluster", func(r *NodeRequest) { r.Cluster = "" }, false},
		{"no name", func(r *NodeRequest) { r.Name = "" }, false},
		{"no cpus", func(r *NodeRequest) { r.CPUs = 0 }, false},
		{"no memory", func(r *NodeRequest) { r.MemoryMiB = -1 }, false},
		{"no pods", func(r *NodeRequest) { r.MaxPods = 0 }, false},
	}
	for _, tc := range tests {
		r := good
		tc.mod(&r)
		if err := r.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate = %v", tc.name, err)
		}
	}
}
