// Command nodetest is the two tiny images the real test node runs, as one static binary:
//
//	pause    the pod sandbox: waits for SIGTERM/SIGINT, reaps orphaned children (PID 1's duty)
//	envdump  a test workload: prints its environment (sorted, one KEY=VALUE per line) and the
//	         line "envdump: ready", then behaves like pause
//
// The mode is the binary's name (argv[0]), or its first argument when that names a mode; other
// arguments (a test pod's vLLM-style args, which gpusched reads from the spec) are ignored. Built
// with CGO_ENABLED=0, so the image is this one file. Kubernetes demands a sandbox image; no
// registry is reachable here.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"
)

func main() {
	mode := filepath.Base(os.Args[0])
	if len(os.Args) > 1 && (os.Args[1] == "pause" || os.Args[1] == "envdump") {
		mode = os.Args[1]
	}
	switch mode {
	case "envdump":
		env := os.Environ()
		sort.Strings(env)
		for _, kv := range env {
			fmt.Println(kv)
		}
		fmt.Println("envdump: ready")
	case "pause":
	default:
		fmt.Fprintf(os.Stderr, "nodetest: unknown mode %q (pause or envdump)\n", mode)
		os.Exit(2)
	}
	wait()
}

// wait blocks until SIGTERM or SIGINT, reaping children on SIGCHLD meanwhile.
func wait() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
