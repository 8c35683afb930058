"""Kubelet-facing gRPC APIs (plugin registration, DRA, DRA health, device plugin, pod resources).

The ``.proto`` sources live in ``proto/``; ``python -m dradriver.kubeletapi.generate`` compiles
them into the (git-ignored) ``dradriver.kubeletapi.gen`` package, one module triple per file:
``<name>_pb2``, ``<name>_pb2.pyi`` and ``<name>_pb2_grpc``.

This module deliberately does not import ``gen``: the generator lives in this package and
must be importable before anything has been generated.

Two kinds of names appear on the kubelet side and are easy to mix up:

* *wire service names* -- the fully-qualified gRPC service (proto package + service), used in
  method paths such as ``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources``;
* *service identifiers* -- the strings a DRA plugin lists in ``PluginInfo.supported_versions``.
  For the DRA node service they differ from the wire names.
"""

from typing import Final

# Wire (fully-qualified) gRPC service names.
PLUGIN_REGISTRATION_SERVICE: Final = "pluginregistration.Registration"
DRA_V1_SERVICE: Final = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
DRA_V1BETA1_SERVICE: Final = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
DRA_HEALTH_V1ALPHA1_SERVICE: Final = "v1alpha1.DRAResourceHealth"
DRA_HEALTH_V1_SERVICE: Final = "v1.DRAResourceHealth"
DEVICE_PLUGIN_REGISTRATION_SERVICE: Final = "v1beta1.Registration"
DEVICE_PLUGIN_SERVICE: Final = "v1beta1.DevicePlugin"
POD_RESOURCES_LISTER_SERVICE: Final = "v1.PodResourcesLister"

# Identifiers for PluginInfo.supported_versions (kubelet's types.go constants).
DRA_V1_IDENTIFIER: Final = "v1.DRAPlugin"
DRA_V1BETA1_IDENTIFIER: Final = "v1beta1.DRAPlugin"
DRA_HEALTH_V1ALPHA1_IDENTIFIER: Final = "v1alpha1.DRAResourceHealth"
DRA_HEALTH_V1_IDENTIFIER: Final = "v1.DRAResourceHealth"

# PluginInfo.type values (pluginregistration constants.go).
PLUGIN_TYPE_CSI: Final = "CSIPlugin"
PLUGIN_TYPE_DEVICE_PLUGIN: Final = "DevicePlugin"
PLUGIN_TYPE_DRA: Final = "DRAPlugin"

# Device plugin API constants (deviceplugin/v1beta1 constants.go).
DEVICE_PLUGIN_API_VERSION: Final = "v1beta1"
DEVICE_PLUGIN_HEALTHY: Final = "Healthy"
DEVICE_PLUGIN_UNHEALTHY: Final = "Unhealthy"

__all__ = [
    "DEVICE_PLUGIN_API_VERSION",
    "DEVICE_PLUGIN_HEALTHY",
    "DEVICE_PLUGIN_REGISTRATION_SERVICE",
    "DEVICE_PLUGIN_SERVICE",
    "DEVICE_PLUGIN_UNHEALTHY",
    "DRA_HEALTH_V1ALPHA1_IDENTIFIER",
    "DRA_HEALTH_V1ALPHA1_SERVICE",
    "DRA_HEALTH_V1_IDENTIFIER",
    "DRA_HEALTH_V1_SERVICE",
    "DRA_V1BETA1_IDENTIFIER",
    "DRA_V1BETA1_SERVICE",
    "DRA_V1_IDENTIFIER",
    "DRA_V1_SERVICE",
    "PLUGIN_REGISTRATION_SERVICE",
    "PLUGIN_TYPE_CSI",
    "PLUGIN_TYPE_DEVICE_PLUGIN",
    "PLUGIN_TYPE_DRA",
    "POD_RESOURCES_LISTER_SERVICE",
]
