package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// output is what -o asks a list or get command to print.
type output string

const (
	outputDefault output = ""     // a list's table, a get's summary
	outputWide    output = "wide" // the same with more columns (or lines)
	outputJSON    output = "json"
	outputYAML    output = "yaml"
)

// parseOutput accepts the -o values every list and get command takes. The
// error leaves naming the value to its caller: pflag says which flag and value,
// applyEnv which environment variable.
func parseOutput(s string) (output, error) {
	switch o := output(s); o {
	case outputDefault, outputWide, outputJSON, outputYAML:
		return o, nil
	}
	return "", errors.New("want one of json, yaml, wide")
}

// Set, String and Type make *output a flag value: a bad -o fails while the
// flags parse (a usage error, exit 2), and so does a bad $SOCIALWEB_OUTPUT.
func (o *output) Set(s string) error {
	v, err := parseOutput(s)
	if err != nil {
		return err
	}
	*o = v
	return nil
}

func (o *output) String() string { return string(*o) }

func (o *output) Type() string { return "format" }

// addOutputFlag adds -o to a list or get command; dflt says what it prints without one.
func addOutputFlag(fs *pflag.FlagSet, o *output, dflt string) {
	fs.VarP(o, "output", "o", "json, yaml or wide (default: "+dflt+")")
}

// writeObject prints v as indented JSON or as YAML.
func writeObject(w io.Writer, o output, v any) error {
	var b []byte
	var err error
	switch o {
	case outputJSON:
		b, err = json.MarshalIndent(v, "", "  ")
		b = append(b, '\n')
	case outputYAML:
		b, err = yaml.Marshal(v)
	default:
		return fmt.Errorf("writing an object as %q: only json and yaml are objects", o)
	}
	if err != nil {
		return fmt.Errorf("encoding %s: %w", o, err)
	}
	_, err = w.Write(b)
	return err
}
