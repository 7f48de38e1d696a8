package agent

// containerdLogLevel is socialweb.containerd-log=<level> from the kernel command line
// when it names one of containerd's levels (to see where a node's Pod start goes: info
// logs each CRI call, debug each pull, shim and CNI step, with times), else configured.
func containerdLogLevel(configured string, kernelArg func(string) (string, bool)) string {
	v, ok := kernelArg("socialweb.containerd-log")
	switch {
	case !ok:
		return configured
	case v == "trace", v == "debug", v == "info", v == "warn", v == "error", v == "fatal", v == "panic":
		return v
	}
	return configured
}
