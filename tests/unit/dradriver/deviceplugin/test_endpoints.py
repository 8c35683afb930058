"""Device-plugin endpoints: the socket each resource is served on."""

from __future__ import annotations

from pathlib import Path

from dradriver.deviceplugin.endpoints import socket_name


def test_socket_names_are_unique_and_fit() -> None:
    assert socket_name("dradriver.dev/mock") == "dradriver.dev_mock.sock"
    assert socket_name("dradriver.dev/mock", "pod-1") == "dradriver.dev_mock-pod-1.sock"
    long = "a" * 60 + ".example.com/" + "b" * 60
    name = socket_name(long, "", Path("/var/lib/kubelet/device-plugins"))
    assert name.startswith("dp-") and len(f"/var/lib/kubelet/device-plugins/{name}") < 108
