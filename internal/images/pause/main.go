// Command pause is the process of a pod's sandbox ("pause") container, what
// registry.k8s.io/pause runs: it holds the pod's namespaces open, sleeps until SIGTERM or
// SIGINT (then exits 0), and, being PID 1 of the pod's PID namespace when the namespace is
// shared, reaps the zombies reparented to it.
//
// internal/images embeds this file and builds it with CGO_ENABLED=0 into a static
// binary, the only file of socialweb's pause image.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const version = "3.10-socialweb"

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-v" || os.Args[1] == "--version") {
		fmt.Println("pause", version)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", s)
		os.Exit(0)
	}
}

// reap collects every exited child without blocking (one SIGCHLD may stand for several).
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
