// Command kube-controller-manager is the upstream component built from the k8s.io/kubernetes
// module so dradriver's local test cluster runs the real thing.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

var _ = context.Background

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
