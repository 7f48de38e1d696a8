package runbook

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		md      string
		want    []Block // File is "f.md"
		wantErr string  // a substring; "" for none
	}{
		{
			name: "indented runbook after a marker",
			md:   "Start it:\n\n<!-- runbook: tour -->\n\n    bin/socialweb serve &   # the daemon\n    curl -s x\n\nThen.\n",
			want: []Block{{Line: 5, Runbook: "tour", Text: "bin/socialweb serve &   # the daemon\ncurl -s x"}},
		},
		{
			name: "fenced block, not run with a reason",
			md:   "<!-- not run: needs gitlab.example.com -->\n```sh\ngitlab-runner register --url https://gitlab.example.com\n```\n",
			want: []Block{{Line: 3, NotRun: "needs gitlab.example.com", Text: "gitlab-runner register --url https://gitlab.example.com"}},
		},
		{
			name: "a blank line inside an indented block keeps it one block",
			md:   "<!-- runbook: a -->\n    kubectl get nodes\n\n    kubectl get pods\n\nText.\n",
			want: []Block{{Line: 2, Runbook: "a", Text: "kubectl get nodes\n\nkubectl get pods"}},
		},
		{
			name:    "commands with no marker are refused",
			md:      "Run:\n\n    socialweb cluster list\n",
			wantErr: "f.md:3: a block of commands with no marker",
		},
		{
			name: "a block that is not commands needs no marker",
			md:   "Layout:\n\n```\napi/v1alpha1   the types\ninternal/       the packages\n```\n\n    key: value\n",
		},
		{
			name:    "a marker followed by prose is an orphan",
			md:      "<!-- runbook: a -->\nSome prose.\n\n    ls\n",
			wantErr: "f.md:1: a runbook marker with no code block after it",
		},
		{
			name:    "a bad runbook name",
			md:      "<!-- runbook: Tour One -->\n    kubectl get nodes\n",
			wantErr: `runbook name "Tour One"`,
		},
		{
			name:    "not run needs a reason",
			md:      "<!-- not run: -->\n    kubectl get nodes\n",
			wantErr: "without a reason",
		},
		{
			name:    "an env prefix and sudo still count as a command",
			md:      "    sudo SOCIALWEB_STATE_DIR=/x socialweb down\n",
			wantErr: "no marker",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("f.md", []byte(tt.md))
			if tt.wantErr == "" && err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Parse = %+v, want %+v", got, tt.want)
			}
			for i := range got {
				w := tt.want[i]
				w.File = "f.md"
				if got[i] != w {
					t.Errorf("block %d = %+v, want %+v", i, got[i], w)
				}
			}
		})
	}
}

func TestScriptJoinsARunbookInOrder(t *testing.T) {
	md := "<!-- runbook: a -->\n    echo one\n\n<!-- runbook: b -->\n    echo other\n\n<!-- runbook: a -->\n    echo two\n"
	blocks, err := Parse("f.md", []byte(md))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Names(blocks), []string{"a", "b"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Names = %v, want %v", got, want)
	}
	if got, want := Script(blocks, "a"), "# f.md:2\necho one\n# f.md:8\necho two\n"; got != want {
		t.Errorf("Script(a) = %q, want %q", got, want)
	}
}
