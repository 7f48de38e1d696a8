package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestParseOutput(t *testing.T) {
	tests := []struct {
		in      string
		want    output
		wantErr bool
	}{
		{"", outputDefault, false},
		{"wide", outputWide, false},
		{"json", outputJSON, false},
		{"yaml", outputYAML, false},
		{"xml", "", true},
		{"YAML", "", true},
		{"table", "", true},
		{"yml", "", true},
	}
	for _, tt := range tests {
		got, err := parseOutput(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseOutput(%q) = %q, %v; want %q, error %t", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && err.Error() != "want one of json, yaml, wide" {
			t.Errorf("parseOutput(%q): %v, want it to say what is accepted", tt.in, err)
		}
	}
}

// Every list and get command refuses a bad -o, or a bad $SOCIALWEB_OUTPUT, as a
// usage error (exit 2) before it connects to anything.
func TestOutputFlagRefused(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     string
		wantErr string
	}{
		{"cluster get", []string{"cluster", "get", "dup", "-o", "xml"}, "", `invalid argument "xml" for "-o, --output" flag: want one of json, yaml, wide`},
		{"cluster list", []string{"cluster", "list", "--output=table"}, "", `invalid argument "table" for "-o, --output" flag: want one of json, yaml, wide`},
		{"image list", []string{"image", "list", "-o", "yml"}, "", `invalid argument "yml" for "-o, --output" flag: want one of json, yaml, wide`},
		{"from the twin", []string{"cluster", "list"}, "xml", `SOCIALWEB_OUTPUT="xml" (twin of --output): want one of json, yaml, wide`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv("SOCIALWEB_OUTPUT", tt.env)
			}
			root := newRootCommand()
			root.SetArgs(append(tt.args, "--state-dir", t.TempDir()))
			err := root.Execute()
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%v: %v, want a usage error containing %q", tt.args, err, tt.wantErr)
			}
		})
	}
}

// Each -o flag documents its default and its environment twin.
func TestOutputFlagUsage(t *testing.T) {
	for _, path := range [][]string{{"cluster", "get"}, {"cluster", "list"}, {"image", "list"}} {
		cmd, _, err := newRootCommand().Find(path)
		if err != nil {
			t.Fatal(err)
		}
		f := cmd.Flags().Lookup("output")
		if f == nil || f.Shorthand != "o" || !strings.Contains(f.Usage, "(default: ") || !strings.Contains(f.Usage, "$SOCIALWEB_OUTPUT") {
			t.Errorf("%v: -o flag %+v, want its default and $SOCIALWEB_OUTPUT in its usage", path, f)
		}
	}
}

func TestWriteObject(t *testing.T) {
	v := map[string]any{"kind": "List", "items": []any{map[string]any{"name": "a"}}}
	tests := []struct {
		o       output
		want    string
		wantErr bool
	}{
		{outputJSON, "{\n  \"items\": [\n    {\n      \"name\": \"a\"\n    }\n  ],\n  \"kind\": \"List\"\n}\n", false},
		{outputYAML, "items:\n- name: a\nkind: List\n", false},
		{outputWide, "", true},
		{outputDefault, "", true},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		err := writeObject(&b, tt.o, v)
		if (err != nil) != tt.wantErr || b.String() != tt.want {
			t.Errorf("writeObject(%q) = %q, %v; want %q, error %t", tt.o, b.String(), err, tt.want, tt.wantErr)
		}
	}
}
