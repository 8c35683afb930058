"""Kubernetes API access shared by the controller and the kubelet plugin.

Requests and responses are plain JSON dicts: the generated ``kubernetes``
models drop fields they do not know and cannot watch ResourceClaims, so the
official client is used only to load connection settings (kubeconfig, exec
plugins, in-cluster service account) and the requests go through :mod:`dradriver.k8s.http`.
"""
