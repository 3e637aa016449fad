// Command kube-scheduler is the upstream kube-scheduler with memplan's
// MemplanGPU plugin registered, built as kubernetes-sigs/scheduler-plugins
// builds its scheduler (cmd/scheduler/main.go: app.NewSchedulerCommand
// with app.WithPlugin). Enable the plugin in a profile of its
// KubeSchedulerConfiguration (deploy/scheduler-config.yaml).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/memplan/memplan/k8s/plugin"
)

func main() {
	cmd := app.NewSchedulerCommand(app.WithPlugin(plugin.Name, plugin.New))
	os.Exit(cli.Run(cmd))
}
