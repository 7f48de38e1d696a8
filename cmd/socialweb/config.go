package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// defaultConfigPath is read when neither --config nor its twin names a file,
// if it exists: an operator's host keeps its settings there.
const defaultConfigPath = "/etc/socialweb/config.yaml"

// Where a setting's value came from, as --print-config says.
const (
	fromFlag    = "flag"
	fromEnv     = "env"
	fromFile    = "file"
	fromDefault = "default"
)

// notSetting says whether flag name is one a config file cannot carry: the
// file's own switches and cobra's help.
func notSetting(name string) bool {
	return name == "config" || name == "print-config" || name == "help"
}

// withConfigFile gives cmd --config and --print-config. The settings a file may
// carry are cmd's flags and the inherited ones it reads (--state-dir), found when
// the command runs, so a flag added later is covered without an edit here.
func withConfigFile(cmd *cobra.Command) {
	var (
		path     string
		printCfg bool
		fileSet  map[string]bool // flags the file set, for --print-config
	)
	f := cmd.Flags()
	f.StringVar(&path, "config", defaultConfigPath, `YAML file of serve's settings, keyed by flag name (default-max-nodes: 5; a list as a YAML sequence or the flag's comma-separated string); a flag or its environment twin beats the file, the file beats the default; the default file is read only if it exists, else none is; "" reads none`)
	f.BoolVar(&printCfg, "print-config", false, "print the effective settings as YAML (each with where it came from: flag, env, file or default), valid input for --config, and exit without serving")
	documentEnv(f)

	pre, run := cmd.PreRunE, cmd.RunE
	// PreRunE runs after the root's PersistentPreRunE has applied the environment,
	// so the file fills only what neither a flag nor a twin gave.
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if pre != nil {
			if err := pre(c, args); err != nil {
				return err
			}
		}
		set, err := applyConfigFile(c, path, c.Flags().Lookup("config").Changed)
		if err != nil {
			return usageError{err}
		}
		fileSet = set
		return nil
	}
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if printCfg {
			return printConfig(c.OutOrStdout(), c, fileSet)
		}
		return run(c, args)
	}
}

// settings are the flags a config file of cmd may carry, sorted by name: cmd's
// own and those it inherits from its parents (--state-dir).
func settings(cmd *cobra.Command) []*pflag.Flag {
	seen := map[string]bool{}
	var out []*pflag.Flag
	visit := func(f *pflag.Flag) {
		// pflag.CommandLine holds what linked packages register (Kubernetes'
		// --version): cobra lists it as inherited, but it is no setting of serve.
		if f.Hidden || notSetting(f.Name) || seen[f.Name] || pflag.CommandLine.Lookup(f.Name) == f {
			return
		}
		seen[f.Name] = true
		out = append(out, f)
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// applyConfigFile sets, from the YAML file at path, every setting not already
// Changed (given as a flag or by its twin), through the flag's own parsing, and
// returns the names it set: nil if no file was read. A missing file is an
// error only if explicit.
func applyConfigFile(cmd *cobra.Command, path string, explicit bool) (map[string]bool, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	doc, err := parseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	byName := map[string]*pflag.Flag{}
	for _, f := range settings(cmd) {
		byName[f.Name] = f
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	set := map[string]bool{}
	var problems []string
	for _, k := range keys {
		f, ok := byName[k]
		if !ok {
			problems = append(problems, unknownKey(k, byName))
			continue
		}
		if f.Changed {
			continue
		}
		if err := setFromConfig(f, doc[k]); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v (want %s)", k, err, wanted(f)))
			continue
		}
		// Given by the file is given, as applyEnv marks a twin's flags.
		f.Changed = true
		set[k] = true
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("config file %s: %s", path, strings.Join(problems, "; "))
	}
	return set, nil
}

// parseConfig reads a config file's top-level mapping. Numbers keep their
// text, so a flag parses what the file says.
func parseConfig(b []byte) (map[string]any, error) {
	j, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, errors.New("want a mapping of serve flag names to values")
	}
	return doc, nil
}

// setFromConfig gives f a config file's value: a scalar through Value.Set, a
// sequence through the slice's Replace (which parses each element), as if
// each element were given alone.
func setFromConfig(f *pflag.Flag, v any) error {
	if items, ok := v.([]any); ok {
		sv, ok := f.Value.(pflag.SliceValue)
		if !ok {
			return errors.New("a list, but the flag takes one value")
		}
		list := make([]string, len(items))
		for i, e := range items {
			s, err := scalarText(e, f.Value.Type() == "boolSlice")
			if err != nil {
				return fmt.Errorf("element %d: %w", i+1, err)
			}
			list[i] = s
		}
		return sv.Replace(list)
	}
	s, err := scalarText(v, f.Value.Type() == "bool")
	if err != nil {
		return err
	}
	return f.Value.Set(s)
}

// scalarText is a YAML scalar as a flag's text; a null is "". A boolean is
// refused where the flag wants text: YAML 1.1 reads an unquoted yes, no, on or
// off as one, and "false" is rarely what was meant.
func scalarText(v any, boolOK bool) (string, error) {
	switch v := v.(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		if !boolOK {
			return "", fmt.Errorf("%t is a boolean (YAML reads unquoted yes, no, on and off as one): quote it to mean the text", v)
		}
		return strconv.FormatBool(v), nil
	case map[string]any:
		return "", errors.New("a mapping, but the flag takes a value")
	default:
		return "", fmt.Errorf("%v, which is not a value", v)
	}
}

// wanted says what f accepts, for an error.
func wanted(f *pflag.Flag) string {
	if _, ok := f.Value.(pflag.SliceValue); ok {
		return "a list: a YAML sequence or one comma-separated string"
	}
	switch t := f.Value.Type(); {
	case t == "bool":
		return "true or false"
	case t == "duration":
		return "a duration such as 90s, 5m or 1h30m"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "an integer"
	case strings.HasPrefix(t, "float"):
		return "a number"
	default:
		return "the text --" + f.Name + " takes"
	}
}

// unknownKey refuses k, naming the settings it is close to.
func unknownKey(k string, byName map[string]*pflag.Flag) string {
	// An env twin's or a flag's spelling of a key is a key.
	norm := strings.ToLower(k)
	norm = strings.TrimPrefix(norm, "socialweb_")
	norm = strings.TrimLeft(strings.ReplaceAll(norm, "_", "-"), "-")
	type near struct {
		name string
		d    int
	}
	var nearest []near
	for name := range byName {
		d := editDistance(norm, name)
		if d <= 2 || (len(norm) >= 4 && strings.Contains(name, norm)) {
			nearest = append(nearest, near{name, d})
		}
	}
	sort.Slice(nearest, func(i, j int) bool {
		if nearest[i].d != nearest[j].d {
			return nearest[i].d < nearest[j].d
		}
		return nearest[i].name < nearest[j].name
	})
	if len(nearest) == 0 {
		return fmt.Sprintf("unknown key %q (keys are the names of serve's flags; socialweb serve --print-config lists them)", k)
	}
	var names []string
	for i := 0; i < len(nearest) && i < 3; i++ {
		names = append(names, nearest[i].name)
	}
	return fmt.Sprintf("unknown key %q (did you mean %s?)", k, strings.Join(names, " or "))
}

// editDistance is the Levenshtein distance of a and b, in bytes (flag names
// are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// printConfig writes cmd's effective settings as a config file, each with
// where its value came from.
func printConfig(w io.Writer, cmd *cobra.Command, fromFileSet map[string]bool) error {
	cmdLine := map[string]bool{}
	cmd.Flags().Visit(func(f *pflag.Flag) { cmdLine[f.Name] = true })
	var b strings.Builder
	b.WriteString("# The effective settings of `socialweb serve`; each line says where its value\n")
	b.WriteString("# came from (flag, env, file or default). Valid input for --config.\n")
	if p := cmd.Flags().Lookup("config"); p != nil && fromFileSet != nil {
		fmt.Fprintf(&b, "# Config file: %s\n", p.Value.String())
	}
	for _, f := range settings(cmd) {
		// applyEnv sets a twin's value through Value.Set, which pflag does not
		// count as given on the command line (FlagSet.Visit): that tells them apart.
		src := fromDefault
		switch {
		case fromFileSet[f.Name]:
			src = fromFile
		case cmdLine[f.Name]:
			src = fromFlag
		case f.Changed:
			src = fromEnv
		}
		if err := writeSetting(&b, f, " # "+src); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSetting writes f's value as a YAML key that applyConfigFile reads back
// to the same value: a bool or number bare, a list as a sequence, anything else
// a string, quoted where YAML would read it as something else.
func writeSetting(b *strings.Builder, f *pflag.Flag, comment string) error {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		list := sv.GetSlice()
		if len(list) == 0 {
			fmt.Fprintf(b, "%s: []%s\n", f.Name, comment)
			return nil
		}
		fmt.Fprintf(b, "%s:%s\n", f.Name, comment)
		for _, e := range list {
			s, err := yamlString(e)
			if err != nil {
				return fmt.Errorf("--%s: %w", f.Name, err)
			}
			fmt.Fprintf(b, "  - %s\n", s)
		}
		return nil
	}
	v := f.Value.String()
	if !bareScalar(f.Value.Type(), v) {
		s, err := yamlString(v)
		if err != nil {
			return fmt.Errorf("--%s: %w", f.Name, err)
		}
		v = s
	}
	fmt.Fprintf(b, "%s: %s%s\n", f.Name, v, comment)
	return nil
}

// bareScalar says whether a value of a flag of type t is written unquoted: a
// bool or a number, whose text YAML reads as the same bool or number.
func bareScalar(t, v string) bool {
	switch {
	case t == "bool":
		return v == "true" || v == "false"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		_, err := strconv.ParseInt(v, 10, 64)
		return err == nil
	case t == "float32" || t == "float64":
		_, err := strconv.ParseFloat(v, 64)
		return err == nil
	}
	return false
}

// yamlString is s as a one-line YAML scalar that reads back as the string s,
// also with a comment after it.
func yamlString(s string) (string, error) {
	if enc, err := yaml.Marshal(s); err == nil {
		line := strings.TrimSuffix(string(enc), "\n")
		if !strings.Contains(line, "\n") && readsAs("k: "+line+" # c", s) {
			return line, nil
		}
	}
	// YAML's double-quoted escapes include Go's.
	q := strconv.Quote(s)
	if !readsAs("k: "+q+" # c", s) {
		return "", fmt.Errorf("%q cannot be written as YAML", s)
	}
	return q, nil
}

// readsAs says whether the one-key document doc gives k the string s.
func readsAs(doc, s string) bool {
	m, err := parseConfig([]byte(doc))
	if err != nil {
		return false
	}
	got, ok := m["k"].(string)
	return ok && got == s
}
