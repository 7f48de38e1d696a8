package manpage

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestEscape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"no placeholder", "no placeholder"},
		{"under <state-dir>/buildcache", `under \<state-dir>/buildcache`},
		{"`x <y>` and <z>", "`x <y>` and \\<z>"},
		{"a <b> `c <d>` e <f> `g`", "a \\<b> `c <d>` e \\<f> `g`"},
		{"an unclosed ` <x>", "an unclosed ` \\<x>"},
		{"", ""},
	} {
		if got := Escape(tc.in); got != tc.want {
			t.Errorf("Escape(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestWrite(t *testing.T) {
	root := &cobra.Command{Use: "tool", Short: "Root of <things>"}
	var dir string
	root.PersistentFlags().StringVar(&dir, "state-dir", "/var/lib/tool", "state, and <state-dir>/cache")
	serve := &cobra.Command{Use: "serve", Short: "Serve", Long: "Writes <state-dir>/x; see `tool <cmd> --help`.", Run: func(*cobra.Command, []string) {}}
	serve.Flags().String("cache", "", "cache under <cache-dir>/images")
	hidden := &cobra.Command{Use: "secret", Hidden: true, Run: func(*cobra.Command, []string) {}}
	root.AddCommand(serve, hidden)
	t.Setenv("SOURCE_DATE_EPOCH", "1764945000") // 2025-12-05

	out := t.TempDir()
	if err := Write(root, out, "tool v1.2.3"); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"tool-serve.1", "tool.1"}; !slices.Equal(names, want) {
		t.Fatalf("pages %q, want %q (hidden commands have none)", names, want)
	}
	page, err := os.ReadFile(filepath.Join(out, "tool-serve.1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`.TH "TOOL" "1" "Dec 2025" "tool v1.2.3" "tool manual"`,
		"<state-dir>/x",            // Long
		"<cmd>",                    // inside a code span
		"under <cache-dir>/images", // a local flag
		"<state-dir>/cache",        // an inherited flag, escaped once
		"tool(1)",                  // SEE ALSO
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("tool-serve.1 lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(string(page), `\<`) || strings.Contains(string(page), "Auto generated") {
		t.Errorf("tool-serve.1 shows an escape or the generator's dated line:\n%s", page)
	}
}
