// Command kubectl is the upstream CLI built at the same version as the
// cluster, so tools that shell out to it (the Helm chart tests, humans
// debugging a local cluster) talk to an apiserver of their own release.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
