package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/buildinfo"
)

// `version`, `version -o wide` and root --version print the build one fact a line;
// -o json the same facts as an object.
func TestVersion(t *testing.T) {
	want := buildinfo.Read()
	for _, tc := range []struct {
		name string
		args []string
		json bool
	}{
		{"version", []string{"version"}, false},
		{"version -o wide", []string{"version", "-o", "wide"}, false},
		{"--version", []string{"--version"}, false},
		{"version -o json", []string{"version", "-o", "json"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newRootCommand()
			var b bytes.Buffer
			root.SetOut(&b)
			root.SetArgs(tc.args)
			if err := root.Execute(); err != nil {
				t.Fatalf("%v: %v", tc.args, err)
			}
			if tc.json {
				var got buildinfo.Info
				if err := json.Unmarshal(b.Bytes(), &got); err != nil {
					t.Fatalf("%v printed %q: %v", tc.args, b.String(), err)
				}
				if got != want {
					t.Errorf("%v = %+v, want %+v", tc.args, got, want)
				}
				return
			}
			if b.String() != want.String() {
				t.Errorf("%v printed\n%s\nwant\n%s", tc.args, b.String(), want.String())
			}
			for _, w := range []string{"socialweb ", "commit:", "kubernetes:", "go:", "platform:"} {
				if !strings.Contains(b.String(), w) {
					t.Errorf("%v printed no %q", tc.args, w)
				}
			}
		})
	}
}
