// Command kube-scheduler is upstream kube-scheduler (the release k8s.io/kubernetes is pinned at in
// go.mod) with the GpuSched plugin registered, built the way kubernetes-sigs/scheduler-plugins
// builds its scheduler. A profile enables GpuSched like any in-tree plugin; its args name the
// gpusched core's socket (see pkg/gpusched).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // for version metric registration
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/gpusched/gpusched/scheduler-plugin/pkg/gpusched"
)

func main() {
	command := app.NewSchedulerCommand(app.WithPlugin(gpusched.Name, gpusched.New))
	os.Exit(cli.Run(command))
}
