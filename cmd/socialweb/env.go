package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envName is a flag's environment twin: --max-nodes is SOCIALWEB_MAX_NODES.
func envName(flag string) string {
	return "SOCIALWEB_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its
// environment twin, so there is one configuration story: flag beats
// environment beats default.
func applyEnv(cmd *cobra.Command) error {
	var errs []string
	visit := func(f *pflag.Flag) {
		if f.Changed || f.Hidden {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Sprintf("%s=%q (twin of --%s): %v", envName(f.Name), v, f.Name, err))
			return
		}
		// Given by its twin is given: commands that apply only what was asked for see it.
		f.Changed = true
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	if len(errs) > 0 {
		return fmt.Errorf("bad environment: %s", strings.Join(errs, "; "))
	}
	return nil
}

// documentEnv appends each flag's environment twin to its usage text.
func documentEnv(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(f.Usage, "$SOCIALWEB_") {
			f.Usage += " ($" + envName(f.Name) + ")"
		}
	})
}
