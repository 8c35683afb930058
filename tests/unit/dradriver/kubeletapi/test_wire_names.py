"""Wire-level conformance of the generated kubelet gRPC modules.

Every expected value below is a literal taken from the kubelet API facts
(/work/shared/reference/kubelet-grpc.md; pod-resources v1 from k8s.io/kubelet
pkg/apis/podresources/v1, which that reference does not cover). Actual values are read
from the generated descriptors and stubs, so a typo in a .proto file fails here.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

import dradriver.kubeletapi as kubeletapi
from dradriver.kubeletapi import generate

pytestmark = pytest.mark.unit


@functools.cache
def _gen(module: str) -> ModuleType:
    """Import ``dradriver.kubeletapi.gen.<module>``, generating gen/ first if it is stale."""
    _ensure_generated()
    return importlib.import_module(f"dradriver.kubeletapi.gen.{module}")


@functools.cache
def _ensure_generated() -> None:
    generate.ensure_generated()


def _message(module: str, name: str) -> Descriptor:
    descriptor: Descriptor = _gen(f"{module}_pb2").DESCRIPTOR.message_types_by_name[name]
    return descriptor


# --------------------------------------------------------------------------------------------
# Method paths
# --------------------------------------------------------------------------------------------

# (proto module stem, service name in that file, method, full path, server streaming)
METHODS = [
    ("pluginregistration_v1", "Registration", "GetInfo",
     "/pluginregistration.Registration/GetInfo", False),
    ("pluginregistration_v1", "Registration", "NotifyRegistrationStatus",
     "/pluginregistration.Registration/NotifyRegistrationStatus", False),
    ("dra_v1", "DRAPlugin", "NodePrepareResources",
     "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", False),
    ("dra_v1", "DRAPlugin", "NodeUnprepareResources",
     "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources", False),
    ("dra_v1beta1", "DRAPlugin", "NodePrepareResources",
     "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources", False),
    ("dra_v1beta1", "DRAPlugin", "NodeUnprepareResources",
     "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources", False),
    ("drahealth_v1alpha1", "DRAResourceHealth", "NodeWatchResources",
     "/v1alpha1.DRAResourceHealth/NodeWatchResources", True),
    ("drahealth_v1", "DRAResourceHealth", "NodeWatchResources",
     "/v1.DRAResourceHealth/NodeWatchResources", True),
    ("deviceplugin_v1beta1", "Registration", "Register",
     "/v1beta1.Registration/Register", False),
    ("deviceplugin_v1beta1", "DevicePlugin", "GetDevicePluginOptions",
     "/v1beta1.DevicePlugin/GetDevicePluginOptions", False),
    ("deviceplugin_v1beta1", "DevicePlugin", "ListAndWatch",
     "/v1beta1.DevicePlugin/ListAndWatch", True),
    ("deviceplugin_v1beta1", "DevicePlugin", "GetPreferredAllocation",
     "/v1beta1.DevicePlugin/GetPreferredAllocation", False),
    ("deviceplugin_v1beta1", "DevicePlugin", "Allocate",
     "/v1beta1.DevicePlugin/Allocate", False),
    ("deviceplugin_v1beta1", "DevicePlugin", "PreStartContainer",
     "/v1beta1.DevicePlugin/PreStartContainer", False),
    ("podresources_v1", "PodResourcesLister", "List",
     "/v1.PodResourcesLister/List", False),
    ("podresources_v1", "PodResourcesLister", "GetAllocatableResources",
     "/v1.PodResourcesLister/GetAllocatableResources", False),
    ("podresources_v1", "PodResourcesLister", "Get",
     "/v1.PodResourcesLister/Get", False),
]  # fmt: skip


class _RecordingChannel:
    """Stand-in for grpc.Channel that records what a generated stub registers."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def _record(self, kind: str) -> Callable[..., object]:
        def register(method: str, *args: Any, **kwargs: Any) -> object:
            self.paths[method] = kind
            return object()

        return register

    def __getattr__(self, kind: str) -> Callable[..., object]:
        if kind not in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            raise AttributeError(kind)
        return self._record(kind)


@pytest.mark.parametrize(("module", "service", "method", "path", "streaming"), METHODS)
def test_method_path_from_descriptor(
    module: str, service: str, method: str, path: str, streaming: bool
) -> None:
    service_desc = _gen(f"{module}_pb2").DESCRIPTOR.services_by_name[service]
    method_desc = service_desc.methods_by_name[method]
    assert f"/{service_desc.full_name}/{method_desc.name}" == path
    assert method_desc.server_streaming is streaming
    assert method_desc.client_streaming is False


@pytest.mark.parametrize(("module", "service", "method", "path", "streaming"), METHODS)
def test_method_path_from_stub(
    module: str, service: str, method: str, path: str, streaming: bool
) -> None:
    channel = _RecordingChannel()
    getattr(_gen(f"{module}_pb2_grpc"), f"{service}Stub")(channel)
    assert channel.paths.get(path) == ("unary_stream" if streaming else "unary_unary")


@pytest.mark.parametrize(
    ("module", "service", "methods"),
    [
        ("pluginregistration_v1", "Registration", {"GetInfo", "NotifyRegistrationStatus"}),
        ("dra_v1", "DRAPlugin", {"NodePrepareResources", "NodeUnprepareResources"}),
        ("dra_v1beta1", "DRAPlugin", {"NodePrepareResources", "NodeUnprepareResources"}),
        ("drahealth_v1alpha1", "DRAResourceHealth", {"NodeWatchResources"}),
        ("drahealth_v1", "DRAResourceHealth", {"NodeWatchResources"}),
        ("deviceplugin_v1beta1", "Registration", {"Register"}),
        (
            "deviceplugin_v1beta1",
            "DevicePlugin",
            {
                "GetDevicePluginOptions",
                "ListAndWatch",
                "GetPreferredAllocation",
                "Allocate",
                "PreStartContainer",
            },
        ),
        ("podresources_v1", "PodResourcesLister", {"List", "GetAllocatableResources", "Get"}),
    ],
)
def test_services_have_exactly_the_expected_methods(
    module: str, service: str, methods: set[str]
) -> None:
    service_desc = _gen(f"{module}_pb2").DESCRIPTOR.services_by_name[service]
    assert {m.name for m in service_desc.methods} == methods


@pytest.mark.parametrize(
    ("module", "package", "services"),
    [
        ("pluginregistration_v1", "pluginregistration", {"Registration"}),
        ("dra_v1", "k8s.io.kubelet.pkg.apis.dra.v1", {"DRAPlugin"}),
        ("dra_v1beta1", "k8s.io.kubelet.pkg.apis.dra.v1beta1", {"DRAPlugin"}),
        ("drahealth_v1alpha1", "v1alpha1", {"DRAResourceHealth"}),
        ("drahealth_v1", "v1", {"DRAResourceHealth"}),
        ("deviceplugin_v1beta1", "v1beta1", {"Registration", "DevicePlugin"}),
        ("podresources_v1", "v1", {"PodResourcesLister"}),
    ],
)
def test_proto_packages(module: str, package: str, services: set[str]) -> None:
    file_desc = _gen(f"{module}_pb2").DESCRIPTOR
    assert file_desc.package == package
    assert set(file_desc.services_by_name) == services
    assert file_desc.name == f"{module}.proto"


@pytest.mark.parametrize(
    ("constant", "module", "service"),
    [
        (kubeletapi.PLUGIN_REGISTRATION_SERVICE, "pluginregistration_v1", "Registration"),
        (kubeletapi.DRA_V1_SERVICE, "dra_v1", "DRAPlugin"),
        (kubeletapi.DRA_V1BETA1_SERVICE, "dra_v1beta1", "DRAPlugin"),
        (kubeletapi.DRA_HEALTH_V1ALPHA1_SERVICE, "drahealth_v1alpha1", "DRAResourceHealth"),
        (kubeletapi.DRA_HEALTH_V1_SERVICE, "drahealth_v1", "DRAResourceHealth"),
        (kubeletapi.DEVICE_PLUGIN_REGISTRATION_SERVICE, "deviceplugin_v1beta1", "Registration"),
        (kubeletapi.DEVICE_PLUGIN_SERVICE, "deviceplugin_v1beta1", "DevicePlugin"),
        (kubeletapi.POD_RESOURCES_LISTER_SERVICE, "podresources_v1", "PodResourcesLister"),
    ],
)
def test_service_name_constants_match_descriptors(constant: str, module: str, service: str) -> None:
    assert _gen(f"{module}_pb2").DESCRIPTOR.services_by_name[service].full_name == constant


def test_supported_versions_identifiers() -> None:
    # The DRA identifiers are NOT the wire names; the health ones happen to be.
    assert kubeletapi.DRA_V1_IDENTIFIER == "v1.DRAPlugin"
    assert kubeletapi.DRA_V1BETA1_IDENTIFIER == "v1beta1.DRAPlugin"
    assert kubeletapi.DRA_HEALTH_V1ALPHA1_IDENTIFIER == "v1alpha1.DRAResourceHealth"
    assert kubeletapi.DRA_HEALTH_V1_IDENTIFIER == "v1.DRAResourceHealth"
    dra_v1_service = _gen("dra_v1_pb2").DESCRIPTOR.services_by_name["DRAPlugin"]
    assert dra_v1_service.full_name != kubeletapi.DRA_V1_IDENTIFIER
    health_service = _gen("drahealth_v1alpha1_pb2").DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert health_service.full_name == kubeletapi.DRA_HEALTH_V1ALPHA1_IDENTIFIER
    assert kubeletapi.PLUGIN_TYPE_DRA == "DRAPlugin"
    assert kubeletapi.PLUGIN_TYPE_DEVICE_PLUGIN == "DevicePlugin"
    assert kubeletapi.PLUGIN_TYPE_CSI == "CSIPlugin"
    assert kubeletapi.DEVICE_PLUGIN_API_VERSION == "v1beta1"


# --------------------------------------------------------------------------------------------
# Messages: exact field names, numbers and types
# --------------------------------------------------------------------------------------------

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT64: "uint64",
}


def _type_name(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        return str(field.message_type.name)
    if field.enum_type is not None:
        return str(field.enum_type.name)
    return _SCALARS[field.type]


def _describe(field: FieldDescriptor) -> str:
    """Render a field roughly as it is spelled in a .proto file."""
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        key, value = message.fields_by_name["key"], message.fields_by_name["value"]
        return f"map<{_type_name(key)}, {_type_name(value)}>"
    if field.is_repeated:
        return f"repeated {_type_name(field)}"
    if message is None and field.has_presence:
        return f"optional {_type_name(field)}"
    return _type_name(field)


_DRA_COMMON: dict[str, dict[str, tuple[int, str]]] = {
    "NodePrepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodePrepareResourcesResponse": {"claims": (1, "map<string, NodePrepareResourceResponse>")},
    "NodePrepareResourceResponse": {"devices": (1, "repeated Device"), "error": (2, "string")},
    "NodeUnprepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodeUnprepareResourcesResponse": {"claims": (1, "map<string, NodeUnprepareResourceResponse>")},
    "NodeUnprepareResourceResponse": {"error": (1, "string")},
    "Claim": {"namespace": (1, "string"), "uid": (2, "string"), "name": (3, "string")},
}
_DRA_DEVICE_V1BETA1 = {
    "request_names": (1, "repeated string"),
    "pool_name": (2, "string"),
    "device_name": (3, "string"),
    "cdi_device_ids": (4, "repeated string"),
}
_HEALTH: dict[str, dict[str, tuple[int, str]]] = {
    "NodeWatchResourcesRequest": {},
    "DeviceIdentifier": {"pool_name": (1, "string"), "device_name": (2, "string")},
    "DeviceHealth": {
        "device": (1, "DeviceIdentifier"),
        "health": (2, "HealthStatus"),
        "last_updated_time": (3, "int64"),
        "health_check_timeout_seconds": (4, "int64"),
        "message": (5, "string"),
    },
    "NodeWatchResourcesResponse": {"devices": (1, "repeated DeviceHealth")},
}

EXPECTED_MESSAGES: dict[str, dict[str, dict[str, tuple[int, str]]]] = {
    "pluginregistration_v1": {
        "PluginInfo": {
            "type": (1, "string"),
            "name": (2, "string"),
            "endpoint": (3, "string"),
            "supported_versions": (4, "repeated string"),
        },
        "RegistrationStatus": {"plugin_registered": (1, "bool"), "error": (2, "string")},
        "RegistrationStatusResponse": {},
        "InfoRequest": {},
    },
    "dra_v1": {
        **_DRA_COMMON,
        "Device": {**_DRA_DEVICE_V1BETA1, "share_id": (5, "optional string")},
    },
    "dra_v1beta1": {**_DRA_COMMON, "Device": _DRA_DEVICE_V1BETA1},
    "drahealth_v1alpha1": _HEALTH,
    "drahealth_v1": _HEALTH,
    "deviceplugin_v1beta1": {
        "DevicePluginOptions": {
            "pre_start_required": (1, "bool"),
            "get_preferred_allocation_available": (2, "bool"),
        },
        "RegisterRequest": {
            "version": (1, "string"),
            "endpoint": (2, "string"),
            "resource_name": (3, "string"),
            "options": (4, "DevicePluginOptions"),
        },
        "Empty": {},
        "ListAndWatchResponse": {"devices": (1, "repeated Device")},
        "TopologyInfo": {"nodes": (1, "repeated NUMANode")},
        "NUMANode": {"ID": (1, "int64")},
        "Device": {"ID": (1, "string"), "health": (2, "string"), "topology": (3, "TopologyInfo")},
        "PreStartContainerRequest": {"devices_ids": (1, "repeated string")},
        "PreStartContainerResponse": {},
        "PreferredAllocationRequest": {
            "container_requests": (1, "repeated ContainerPreferredAllocationRequest")
        },
        "ContainerPreferredAllocationRequest": {
            "available_deviceIDs": (1, "repeated string"),
            "must_include_deviceIDs": (2, "repeated string"),
            "allocation_size": (3, "int32"),
        },
        "PreferredAllocationResponse": {
            "container_responses": (1, "repeated ContainerPreferredAllocationResponse")
        },
        "ContainerPreferredAllocationResponse": {"deviceIDs": (1, "repeated string")},
        "AllocateRequest": {"container_requests": (1, "repeated ContainerAllocateRequest")},
        "ContainerAllocateRequest": {"devices_ids": (1, "repeated string")},
        "CDIDevice": {"name": (1, "string")},
        "AllocateResponse": {"container_responses": (1, "repeated ContainerAllocateResponse")},
        "ContainerAllocateResponse": {
            "envs": (1, "map<string, string>"),
            "mounts": (2, "repeated Mount"),
            "devices": (3, "repeated DeviceSpec"),
            "annotations": (4, "map<string, string>"),
            "cdi_devices": (5, "repeated CDIDevice"),
        },
        "Mount": {
            "container_path": (1, "string"),
            "host_path": (2, "string"),
            "read_only": (3, "bool"),
        },
        "DeviceSpec": {
            "container_path": (1, "string"),
            "host_path": (2, "string"),
            "permissions": (3, "string"),
        },
    },
    # Not in the reference document; facts from k8s.io/kubelet pkg/apis/podresources/v1.
    "podresources_v1": {
        "AllocatableResourcesRequest": {},
        "AllocatableResourcesResponse": {
            "devices": (1, "repeated ContainerDevices"),
            "cpu_ids": (2, "repeated int64"),
            "memory": (3, "repeated ContainerMemory"),
        },
        "ListPodResourcesRequest": {},
        "ListPodResourcesResponse": {"pod_resources": (1, "repeated PodResources")},
        "PodResources": {
            "name": (1, "string"),
            "namespace": (2, "string"),
            "containers": (3, "repeated ContainerResources"),
            "cpu_ids": (4, "repeated int64"),
            "memory": (5, "repeated ContainerMemory"),
        },
        "ContainerResources": {
            "name": (1, "string"),
            "devices": (2, "repeated ContainerDevices"),
            "cpu_ids": (3, "repeated int64"),
            "memory": (4, "repeated ContainerMemory"),
            "dynamic_resources": (5, "repeated DynamicResource"),
        },
        "ContainerMemory": {
            "memory_type": (1, "string"),
            "size": (2, "uint64"),
            "topology": (3, "TopologyInfo"),
        },
        "ContainerDevices": {
            "resource_name": (1, "string"),
            "device_ids": (2, "repeated string"),
            "topology": (3, "TopologyInfo"),
        },
        "TopologyInfo": {"nodes": (1, "repeated NUMANode")},
        "NUMANode": {"ID": (1, "int64")},
        "DynamicResource": {
            "claim_name": (2, "string"),
            "claim_namespace": (3, "string"),
            "claim_resources": (4, "repeated ClaimResource"),
        },
        "ClaimResource": {
            "cdi_devices": (1, "repeated CDIDevice"),
            "driver_name": (2, "string"),
            "pool_name": (3, "string"),
            "device_name": (4, "string"),
            "share_id": (5, "optional string"),
        },
        "CDIDevice": {"name": (1, "string")},
        "GetPodResourcesRequest": {"pod_name": (1, "string"), "pod_namespace": (2, "string")},
        "GetPodResourcesResponse": {"pod_resources": (1, "PodResources")},
    },
}


@pytest.mark.parametrize("module", sorted(EXPECTED_MESSAGES))
def test_module_has_exactly_the_expected_messages(module: str) -> None:
    file_desc = _gen(f"{module}_pb2").DESCRIPTOR
    assert set(file_desc.message_types_by_name) == set(EXPECTED_MESSAGES[module])


@pytest.mark.parametrize(
    ("module", "message"),
    [(module, message) for module, messages in EXPECTED_MESSAGES.items() for message in messages],
)
def test_message_fields(module: str, message: str) -> None:
    descriptor = _message(module, message)
    actual = {field.name: (field.number, _describe(field)) for field in descriptor.fields}
    assert actual == EXPECTED_MESSAGES[module][message]


# The fields the brief singles out, checked one by one through fields_by_name.
@pytest.mark.parametrize(
    ("module", "message", "field", "number"),
    [
        ("dra_v1", "NodePrepareResourcesRequest", "claims", 1),
        ("dra_v1", "Claim", "namespace", 1),
        ("dra_v1", "Claim", "uid", 2),
        ("dra_v1", "Claim", "name", 3),
        ("dra_v1", "Device", "request_names", 1),
        ("dra_v1", "Device", "pool_name", 2),
        ("dra_v1", "Device", "device_name", 3),
        ("dra_v1", "Device", "cdi_device_ids", 4),
        ("dra_v1", "Device", "share_id", 5),
        ("dra_v1beta1", "NodePrepareResourcesRequest", "claims", 1),
        ("dra_v1beta1", "Device", "cdi_device_ids", 4),
        ("pluginregistration_v1", "PluginInfo", "type", 1),
        ("pluginregistration_v1", "PluginInfo", "name", 2),
        ("pluginregistration_v1", "PluginInfo", "endpoint", 3),
        ("pluginregistration_v1", "PluginInfo", "supported_versions", 4),
        ("pluginregistration_v1", "RegistrationStatus", "plugin_registered", 1),
        ("pluginregistration_v1", "RegistrationStatus", "error", 2),
        ("deviceplugin_v1beta1", "RegisterRequest", "version", 1),
        ("deviceplugin_v1beta1", "RegisterRequest", "endpoint", 2),
        ("deviceplugin_v1beta1", "RegisterRequest", "resource_name", 3),
        ("deviceplugin_v1beta1", "RegisterRequest", "options", 4),
        ("deviceplugin_v1beta1", "ContainerAllocateResponse", "envs", 1),
        ("deviceplugin_v1beta1", "ContainerAllocateResponse", "mounts", 2),
        ("deviceplugin_v1beta1", "ContainerAllocateResponse", "devices", 3),
        ("deviceplugin_v1beta1", "ContainerAllocateResponse", "annotations", 4),
        ("deviceplugin_v1beta1", "ContainerAllocateResponse", "cdi_devices", 5),
        ("drahealth_v1alpha1", "DeviceHealth", "health_check_timeout_seconds", 4),
        ("drahealth_v1alpha1", "DeviceHealth", "message", 5),
    ],
)
def test_field_number(module: str, message: str, field: str, number: int) -> None:
    assert _message(module, message).fields_by_name[field].number == number


def test_dra_v1beta1_device_has_no_share_id() -> None:
    assert "share_id" not in _message("dra_v1beta1", "Device").fields_by_name


@pytest.mark.parametrize("module", ["drahealth_v1alpha1", "drahealth_v1"])
def test_health_status_enum(module: str) -> None:
    enum = _gen(f"{module}_pb2").DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {value.name: value.number for value in enum.values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }


def test_all_modules_load_together() -> None:
    # Both "v1" files (health and pod-resources) and both "DRAPlugin" versions share one
    # descriptor pool; a clash would raise at import time.
    names = {_gen(f"{module}_pb2_grpc").__name__ for module in EXPECTED_MESSAGES}
    assert len(names) == len(EXPECTED_MESSAGES)


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------


def test_claim_wire_bytes() -> None:
    dra = _gen("dra_v1_pb2")
    claim = dra.Claim(namespace="ns", uid="u1", name="c")
    # field 1 (namespace), 2 (uid), 3 (name), each wire type 2 (length-delimited)
    assert claim.SerializeToString() == b"\x0a\x02ns\x12\x02u1\x1a\x01c"


def test_dra_v1_prepare_response_round_trip() -> None:
    dra = _gen("dra_v1_pb2")
    response = dra.NodePrepareResourcesResponse()
    ok = response.claims["uid-1"]
    ok.devices.add(
        request_names=["gpu"],
        pool_name="node-a",
        device_name="gpu-0",
        cdi_device_ids=["example.com/gpu=gpu-0"],
        share_id="",
    )
    ok.devices.add(pool_name="node-a", device_name="gpu-1")
    response.claims["uid-2"].error = "boom"

    parsed = dra.NodePrepareResourcesResponse.FromString(response.SerializeToString())

    assert parsed == response
    assert set(parsed.claims) == {"uid-1", "uid-2"}
    first, second = parsed.claims["uid-1"].devices
    assert list(first.request_names) == ["gpu"]
    assert list(first.cdi_device_ids) == ["example.com/gpu=gpu-0"]
    # share_id has presence: an explicitly set empty string survives, an unset one does not.
    assert first.HasField("share_id")
    assert not second.HasField("share_id")
    assert parsed.claims["uid-2"].error == "boom"


def test_dra_v1_device_parses_as_v1beta1() -> None:
    v1 = _gen("dra_v1_pb2")
    v1beta1 = _gen("dra_v1beta1_pb2")
    device = v1.Device(
        request_names=["r"],
        pool_name="p",
        device_name="d",
        cdi_device_ids=["a/b=c"],
        share_id="s",
    )
    old = v1beta1.Device.FromString(device.SerializeToString())
    assert (list(old.request_names), old.pool_name, old.device_name, list(old.cdi_device_ids)) == (
        ["r"],
        "p",
        "d",
        ["a/b=c"],
    )
    # The unknown field 5 is kept and goes back on the wire unchanged.
    assert v1.Device.FromString(old.SerializeToString()).share_id == "s"
