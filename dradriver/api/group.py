"""The driver's API group (named after the driver): its version and the kinds of opaque
parameters a claim or class can give this driver.

The custom resources (:mod:`dradriver.api.parameters`, :mod:`dradriver.api.networkpool`)
and the opaque ``parameters`` objects share the version, ``<driver>/v1alpha1``.
"""

from __future__ import annotations

VERSION = "v1alpha1"

DEVICE_CONFIG_KIND = "DeviceConfig"
"""Node-side settings, read by the kubelet plugin (:mod:`dradriver.api.deviceconfig`)."""
PARAMETERS_KIND = "DeviceClaimParameters"
"""Parameters inline; also the custom resource's kind (:mod:`dradriver.api.parameters`)."""
PARAMETERS_REFERENCE_KIND = "DeviceClaimParametersReference"
"""A DeviceClaimParameters object in the claim's namespace, by name."""
OPAQUE_KINDS = (DEVICE_CONFIG_KIND, PARAMETERS_KIND, PARAMETERS_REFERENCE_KIND)


def api_version(driver: str) -> str:
    """``apiVersion`` of this driver's objects: ``<driver>/v1alpha1``."""
    return f"{driver}/{VERSION}"
