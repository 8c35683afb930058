"""The project's local Kubernetes cluster: real kube components on loopback."""
