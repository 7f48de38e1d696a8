package main

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// sampleConfig is the sample config file, generated from serve's flags.
const sampleConfig = "../../deploy/config.yaml"

// clearEnv unsets every SOCIALWEB_* variable for the test, so the host's
// environment reaches no setting.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SOCIALWEB_") {
			t.Setenv(k, "") // restores it after the test
			os.Unsetenv(k)
		}
	}
}

// testServe is a root command and its serve, whose default config file is
// defaultConfig instead of /etc/socialweb/config.yaml: a value set without
// marking the flag Changed is its default.
func testServe(t *testing.T, defaultConfig string) (root, serve *cobra.Command) {
	t.Helper()
	root = newRootCommand()
	serve, _, err := root.Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	f := serve.Flags().Lookup("config")
	if err := f.Value.Set(defaultConfig); err != nil {
		t.Fatal(err)
	}
	f.DefValue = defaultConfig
	return root, serve
}

// runServe runs serve with args and returns what it printed.
func runServe(t *testing.T, root *cobra.Command, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs(append([]string{"serve"}, args...))
	err := root.Execute()
	return out.String(), err
}

// effective is each setting's value as text, lists element by element.
func effective(serve *cobra.Command) map[string]string {
	m := map[string]string{}
	for _, f := range settings(serve) {
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			m[f.Name] = fmt.Sprintf("%q", sv.GetSlice())
			continue
		}
		m[f.Name] = f.Value.String()
	}
	return m
}

// sources are the sources --print-config gave, by setting.
func sources(t *testing.T, printed string) map[string]string {
	t.Helper()
	sourceLine := regexp.MustCompile(`^([a-z0-9][a-z0-9-]*):.* # (flag|env|file|default)$`)
	m := map[string]string{}
	for _, l := range strings.Split(printed, "\n") {
		if s := sourceLine.FindStringSubmatch(l); s != nil {
			m[s[1]] = s[2]
		}
	}
	return m
}

// nonDefault is a value unlike f's default, as --NAME=VALUE takes it; i picks
// a string among some YAML reads as something else unless quoted.
func nonDefault(t *testing.T, f *pflag.Flag, i int) string {
	t.Helper()
	awkward := []string{"0", "", "yes", "a: b # c", "null", "~", "1e3", " lead", "-", "[x]", "{y}", `'q"`, "line1\nline2", "ünï", "@x", "!x", "*x", "x:", "? x", "#x", "0x10", "off", "2026-01-02", "trailing "}
	switch ty := f.Value.Type(); ty {
	case "bool":
		b, err := strconv.ParseBool(f.DefValue)
		if err != nil {
			t.Fatal(err)
		}
		return strconv.FormatBool(!b)
	case "int", "int32", "int64":
		n, err := strconv.ParseInt(f.DefValue, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return strconv.FormatInt(n+1, 10)
	case "duration":
		d, err := time.ParseDuration(f.DefValue)
		if err != nil {
			t.Fatal(err)
		}
		return (d + 1500*time.Millisecond).String()
	case "string":
		for j := 0; ; j++ {
			if s := awkward[(i+j)%len(awkward)]; s != f.DefValue {
				return s
			}
		}
	case "stringSlice":
		var b bytes.Buffer
		w := csv.NewWriter(&b)
		if err := w.Write([]string{awkward[i%len(awkward)], "a,b", "", "yes"}); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		return strings.TrimSuffix(b.String(), "\n")
	default:
		t.Fatalf("--%s is of type %s, which this test has no value for: add one", f.Name, ty)
		return ""
	}
}

// Every setting, given a value unlike its default as a flag, is printed by
// --print-config; that output read back with --config gives every setting the
// same value, from the file, and prints the same again.
func TestConfigRoundTrip(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.yaml")
	root, serve := testServe(t, missing)
	defaults := effective(serve)
	args := []string{"--print-config"}
	for i, f := range settings(serve) {
		args = append(args, "--"+f.Name+"="+nonDefault(t, f, i))
	}
	printed, err := runServe(t, root, args...)
	if err != nil {
		t.Fatalf("serve %q: %v", args, err)
	}
	want := effective(serve)
	src := sources(t, printed)
	for name, v := range want {
		if v == defaults[name] {
			t.Errorf("--%s is still its default %s: the test gave it nothing", name, v)
		}
		if src[name] != fromFlag {
			t.Errorf("%s: printed as from %q, want flag", name, src[name])
		}
	}
	if len(want) < 40 {
		t.Errorf("only %d settings: %v", len(want), want)
	}

	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte(printed), 0o600); err != nil {
		t.Fatal(err)
	}
	root, serve = testServe(t, missing)
	again, err := runServe(t, root, "--print-config", "--config", file)
	if err != nil {
		t.Fatalf("serve --config (the printed settings): %v\n%s", err, printed)
	}
	got := effective(serve)
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s: %s from the file, want %s", name, got[name], v)
		}
	}
	for name, s := range sources(t, again) {
		if s != fromFile {
			t.Errorf("%s: printed as from %q, want file", name, s)
		}
	}
	if len(sources(t, again)) != len(want) {
		t.Errorf("printed %d settings, want %d:\n%s", len(sources(t, again)), len(want), again)
	}
	if s, w := settingLines(strings.ReplaceAll(again, " # file", " # flag")), settingLines(printed); s != w {
		t.Errorf("printed from the file:\n%s\nwant, but for the sources:\n%s", s, w)
	}
}

// settingLines is printed without its comment lines.
func settingLines(printed string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(printed, "\n") {
		if !strings.HasPrefix(l, "#") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// A flag beats its environment twin, which beats the file, which beats the
// default; --state-dir, a global flag, too. The default file is read if it
// exists, and a missing one is no error.
func TestConfigPrecedence(t *testing.T) {
	const file = "default-max-nodes: 7\nstate-dir: /from/file\negress-allow: [10.0.0.0/8, 192.168.5.0/24]\n"
	type setting struct{ value, source string }
	for _, tc := range []struct {
		name    string
		file    string // at the default path unless viaFlag
		viaFlag bool   // --config names the file
		viaEnv  bool   // SOCIALWEB_CONFIG names the file
		args    []string
		env     map[string]string
		want    map[string]setting
	}{
		{"file", file, true, false, nil, nil, map[string]setting{
			"default-max-nodes": {"7", fromFile},
			"state-dir":         {"/from/file", fromFile},
			"egress-allow":      {`["10.0.0.0/8" "192.168.5.0/24"]`, fromFile},
			"api-port":          {"7443", fromDefault},
		}},
		{"the default file", file, false, false, nil, nil, map[string]setting{
			"default-max-nodes": {"7", fromFile},
		}},
		{"a file the twin names", file, false, true, nil, nil, map[string]setting{
			"default-max-nodes": {"7", fromFile},
		}},
		{"no default file", "", false, false, nil, nil, map[string]setting{
			"default-max-nodes": {"5", fromDefault},
			"state-dir":         {defaultStateDir, fromDefault},
		}},
		{"a list as the flag's string", "egress-allow: 10.0.0.0/8,192.168.5.0/24\n", true, false, nil, nil, map[string]setting{
			"egress-allow": {`["10.0.0.0/8" "192.168.5.0/24"]`, fromFile},
		}},
		{"a flag beats the file", file, true, false, []string{"--default-max-nodes", "9", "--state-dir", "/from/flag"}, nil, map[string]setting{
			"default-max-nodes": {"9", fromFlag},
			"state-dir":         {"/from/flag", fromFlag},
			"egress-allow":      {`["10.0.0.0/8" "192.168.5.0/24"]`, fromFile},
		}},
		{"a twin beats the file", file, true, false, nil, map[string]string{"SOCIALWEB_DEFAULT_MAX_NODES": "8", "SOCIALWEB_STATE_DIR": "/from/env", "SOCIALWEB_EGRESS_ALLOW": ""}, map[string]setting{
			"default-max-nodes": {"8", fromEnv},
			"state-dir":         {"/from/env", fromEnv},
			"egress-allow":      {`[]`, fromEnv},
		}},
		{"a flag beats its twin", file, true, false, []string{"--default-max-nodes", "9"}, map[string]string{"SOCIALWEB_DEFAULT_MAX_NODES": "8"}, map[string]setting{
			"default-max-nodes": {"9", fromFlag},
		}},
		{"--config \"\" reads no file", file, false, false, []string{"--config", ""}, nil, map[string]setting{
			"default-max-nodes": {"5", fromDefault},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			dir := t.TempDir()
			path := filepath.Join(dir, "config.yaml")
			defaultPath := path
			args := append([]string{"--print-config"}, tc.args...)
			if tc.viaFlag || tc.viaEnv {
				defaultPath = filepath.Join(dir, "none.yaml")
			}
			if tc.viaFlag {
				args = append(args, "--config", path)
			}
			if tc.viaEnv {
				t.Setenv("SOCIALWEB_CONFIG", path)
			}
			if tc.file != "" {
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			root, serve := testServe(t, defaultPath)
			printed, err := runServe(t, root, args...)
			if err != nil {
				t.Fatalf("serve %q: %v", args, err)
			}
			got, src := effective(serve), sources(t, printed)
			for name, w := range tc.want {
				if got[name] != w.value || src[name] != w.source {
					t.Errorf("%s: %s from %s, want %s from %s", name, got[name], src[name], w.value, w.source)
				}
			}
		})
	}
}

// Unknown keys, bad values and a missing file someone named are refused as bad
// input (exit status 2), naming the key and what would do, before serve
// starts anything.
func TestConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{"a typo", "max-nodes: 3\n", nil, nil, []string{`unknown key "max-nodes" (did you mean default-max-nodes?)`}},
		{"a cluster create flag", "node-cpus: 2\n", nil, nil, []string{`unknown key "node-cpus" (did you mean default-node-cpus`}},
		{"a twin's name", "SOCIALWEB_API_PORT: 1\n", nil, nil, []string{`unknown key "SOCIALWEB_API_PORT" (did you mean api-port?)`}},
		{"far from any key", "zzzzzz: 1\n", nil, nil, []string{`unknown key "zzzzzz" (keys are the names of serve's flags`}},
		{"config in a config file", "config: /etc/other.yaml\n", nil, nil, []string{`unknown key "config"`}},
		{"a bad duration", "default-hold: soon\n", nil, nil, []string{`default-hold: time: invalid duration "soon" (want a duration such as 90s`}},
		{"a bad integer", "default-max-nodes: five\n", nil, nil, []string{`default-max-nodes: `, `"five"`, `(want an integer)`}},
		{"a bad bool", "build-cache: yes please\n", nil, nil, []string{`build-cache: `, `(want true or false)`}},
		{"YAML 1.1's off for text", "controlplane-gogc: off\n", nil, nil, []string{`controlplane-gogc: false is a boolean`, `quote it`}},
		{"a list for one value", "api-port: [1, 2]\n", nil, nil, []string{`api-port: a list, but the flag takes one value (want an integer)`}},
		{"a mapping", "egress: {mode: none}\n", nil, nil, []string{`egress: a mapping, but the flag takes a value`}},
		{"a mapping in a list", "registry-mirror: [{docker.io: x}]\n", nil, nil, []string{`registry-mirror: element 1: a mapping`, `(want a list: a YAML sequence or one comma-separated string)`}},
		{"every problem at once", "max-nodes: 3\ndefault-hold: soon\n", nil, nil, []string{`default-hold: time`, `unknown key "max-nodes"`}},
		{"a key twice", "api-port: 1\napi-port: 2\n", nil, nil, []string{`api-port`, `already set`}},
		{"not a mapping", "- api-port\n", nil, nil, []string{`want a mapping of serve flag names to values`}},
		{"not YAML", "api-port: [1\n", nil, nil, []string{`config file `}},
		{"a missing file named by the flag", "", []string{"--config", "/nonexistent/socialweb.yaml"}, nil, []string{`open /nonexistent/socialweb.yaml: no such file or directory`}},
		{"a missing file named by the twin", "", nil, map[string]string{"SOCIALWEB_CONFIG": "/nonexistent/twin.yaml"}, []string{`open /nonexistent/twin.yaml`}},
		{"an unknown key under a flag", "default-max-nodes: 3\nmax-node: 1\n", []string{"--default-max-nodes", "4"}, nil, []string{`unknown key "max-node"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			dir := t.TempDir()
			args := append([]string{"--print-config"}, tc.args...)
			if tc.file != "" {
				path := filepath.Join(dir, "config.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", path)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			root, _ := testServe(t, filepath.Join(dir, "none.yaml"))
			printed, err := runServe(t, root, args...)
			if err == nil {
				t.Fatalf("serve %q: no error; printed\n%s", args, printed)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("serve %q: %v, want an error containing %q", args, err, w)
				}
			}
			if !errors.As(err, new(usageError)) {
				t.Errorf("serve %q: %v is no usageError (exit status 2)", args, err)
			}
			if printed != "" {
				t.Errorf("printed %q before refusing", printed)
			}
		})
	}
}

// A value only serve's own checks refuse (a quantity held as text) is refused
// from the file as from the flag, before serve starts anything.
func TestConfigReachesServeChecks(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte("default-node-memory: lots\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, _ := testServe(t, filepath.Join(dir, "none.yaml"))
	// Should the file not be read, --datastore nope still stops serve (as in TestServeEgressFlags).
	_, err := runServe(t, root, "--config", path, "--state-dir", dir, "--datastore", "nope", "--node-network=false")
	const want = `--default-node-memory "lots"`
	if err == nil || !strings.Contains(err.Error(), want) || !errors.As(err, new(usageError)) {
		t.Errorf("serve: %v, want a usageError containing %q", err, want)
	}
}

// sampleText is deploy/config.yaml as the flag set makes it: every setting at
// its default, under its help text.
func sampleText(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`# Sample configuration of socialweb serve: every key it reads, each at its
# default, under the help of the flag of the same name. Copy it to
# /etc/socialweb/config.yaml (read at start if it exists; --config PATH or
# $SOCIALWEB_CONFIG names another file) and keep only the keys you change, so
# that a later release's defaults reach the rest. A command-line flag beats its
# environment twin, which beats this file, which beats the default.
# socialweb serve --print-config prints the effective settings and where each
# came from.
#
# Generated from serve's flags by TestSampleConfig (cmd/socialweb); after a
# flag changes: UPDATE_SAMPLE_CONFIG=1 go test ./cmd/socialweb -run TestSampleConfig
`)
	_, serve := testServe(t, filepath.Join(t.TempDir(), "none.yaml"))
	for _, f := range settings(serve) {
		b.WriteString("\n")
		for _, l := range wrap(f.Usage, 76) {
			b.WriteString("# " + l + "\n")
		}
		if err := writeSetting(&b, f, ""); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// wrap breaks s into lines of at most width bytes, at spaces.
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return append(lines, line)
}

// deploy/config.yaml has a key for every setting and no other, each at its
// default, and is what the flag set generates.
func TestSampleConfig(t *testing.T) {
	clearEnv(t)
	want := sampleText(t)
	if os.Getenv("UPDATE_SAMPLE_CONFIG") != "" {
		if err := os.WriteFile(sampleConfig, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(sampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := parseConfig(b)
	if err != nil {
		t.Fatalf("%s: %v", sampleConfig, err)
	}
	root, serve := testServe(t, filepath.Join(t.TempDir(), "none.yaml"))
	defaults := effective(serve)
	var missing, extra []string
	for name := range defaults {
		if _, ok := doc[name]; !ok {
			missing = append(missing, name)
		}
	}
	for k := range doc {
		if _, ok := defaults[k]; !ok {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("%s lacks the settings %v", sampleConfig, missing)
	}
	if len(extra) > 0 {
		t.Errorf("%s has keys that are no setting of serve: %v", sampleConfig, extra)
	}
	if len(missing) == 0 && len(extra) == 0 {
		printed, err := runServe(t, root, "--print-config", "--config", sampleConfig)
		if err != nil {
			t.Fatalf("serve --config %s: %v", sampleConfig, err)
		}
		got, src := effective(serve), sources(t, printed)
		for name, v := range defaults {
			if got[name] != v || src[name] != fromFile {
				t.Errorf("%s: %s from %s, want the default %s from the file", name, got[name], src[name], v)
			}
		}
	}
	if string(b) != want {
		t.Errorf("%s differs from what serve's flags generate; regenerate it: UPDATE_SAMPLE_CONFIG=1 go test ./cmd/socialweb -run TestSampleConfig", sampleConfig)
	}
}
