"""Names users depend on: moving code must never change them.

Console scripts, logger names, metric names, CRD files, CDI spec and device
names, the ledger's file name and format version. The scans read the product
source, not module paths, so they keep working whatever the layout.
"""

from __future__ import annotations

import re
import tomllib
from importlib import import_module
from pathlib import Path

from dradriver.host.cdi import CDIRegistry
from dradriver.host.state.schema import SUPPORTED_VERSION

REPO = Path(__file__).resolve().parents[3]
PRODUCT = ("dradriver", "controller", "kubeletplugin", "devtools")

CONSOLE_SCRIPTS = {
    "dradriver",
    "dradriver-controller",
    "dradriver-kubeletplugin",
    "dradriver-webhook",
}

LOGGER_NAMES = {
    "cdi",
    "cluster",
    "cluster.binaries",
    "cluster.containerd",
    "cluster.helmbin",
    "cluster.kwok",
    "cluster.kwokbin",
    "cluster.kwokpools",
    "cluster.runtimebin",
    "controller",
    "controller.networkpools",
    "controller.pinning",
    "devices.devglob",
    "devices.health",
    "devices.hostdev",
    "devices.pci",
    "devices.slices",
    "devices.static",
    "hooks",
    "informer",
    "kube",
    "kubeletplugin",
    "kubeletplugin.claimstatus",
    "kubeletplugin.deviceplugin",
    "kubeletplugin.devicemetadata",
    "kubeletplugin.doctor",
    "kubeletplugin.driver",
    "kubeletplugin.inventory",
    "kubeletplugin.podresources",
    "leaderelection",
    "ledger",
    "plugin.deviceplugin",
    "plugin.grpc",
    "plugin.helper",
    "plugin.slices",
    "webhook",
}

METRIC_NAMES = {
    "dradriver_kubelet_calls_total",
    "dradriver_deviceplugin_allocation_errors_total",
    "dradriver_deviceplugin_allocations_total",
    "dradriver_deviceplugin_conflicts_total",
    "dradriver_deviceplugin_devices",
    "dradriver_deviceplugin_holds",
    "dradriver_deviceplugin_pod_resources_errors_total",
    "dradriver_deviceplugin_pod_resources_polls_total",
    "dradriver_deviceplugin_prestart_total",
    "dradriver_deviceplugin_registered",
    "dradriver_deviceplugin_registrations_total",
    "dradriver_deviceplugin_releases_total",
    "dradriver_deviceplugin_rpc_seconds",
    "dradriver_informer_events_total",
    "dradriver_informer_relists_total",
    "dradriver_informer_skipped_total",
    "dradriver_informer_synced",
    "dradriver_informer_watches_total",
    "dradriver_kubelet_registrations_total",
    "dradriver_leader",
    "dradriver_leader_acquisitions_total",
    "dradriver_prepare_errors_total",
    "dradriver_prepare_in_flight",
    "dradriver_prepare_seconds",
    "dradriver_prepare_total",
    "dradriver_prepared_devices",
    "dradriver_reconcile_seconds",
    "dradriver_controller_claim_stage_seconds",
    "dradriver_controller_unreadable_claims",
    "dradriver_reconcile_total",
    "dradriver_resourceslice_writes_total",
    "dradriver_unhealthy_devices",
    "dradriver_unprepare_errors_total",
    "dradriver_unprepare_seconds",
    "dradriver_unprepare_total",
    "dradriver_webhook_request_duration_seconds",
    "dradriver_webhook_requests",
    "dradriver_workqueue_adds_total",
    "dradriver_workqueue_depth",
    "dradriver_workqueue_retries_total",
}


def _product_sources() -> list[str]:
    files: list[Path] = []
    for package in PRODUCT:
        files += [p for p in (REPO / package).rglob("*.py") if "gen" not in p.parts]
    return [p.read_text() for p in files]


def test_console_scripts_are_pinned_and_resolve() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == CONSOLE_SCRIPTS
    for target in scripts.values():
        module, _, attr = target.partition(":")
        assert callable(getattr(import_module(module), attr)), target


def test_logger_names_are_pinned() -> None:
    found: set[str] = set()
    for text in _product_sources():
        found |= set(re.findall(r'get_logger\("([^"]+)"\)', text))
    assert found == LOGGER_NAMES


def test_metric_names_are_pinned() -> None:
    found: set[str] = set()
    for text in _product_sources():
        found |= set(re.findall(r'"(dradriver_[a-z_]+)"', text))
    assert found == METRIC_NAMES


def test_crd_files_are_pinned() -> None:
    crds = sorted(p.name for p in (REPO / "manifests" / "controller").glob("crd-*.yaml"))
    assert crds == ["crd-deviceclaimparameters.yaml", "crd-networkdevicepools.yaml"]


def test_cdi_spec_and_device_names_are_pinned(tmp_path: Path) -> None:
    registry = CDIRegistry(tmp_path, "dradriver.dev")
    uid = "0b0e7e9c-1111-2222-3333-444455556666"
    assert registry.spec_path(uid) == tmp_path / f"dradriver.dev-device_claim-{uid}.json"
    assert registry.cdi_id(uid, "dev-0") == f"dradriver.dev/device={uid}-dev-0"


def test_ledger_file_name_and_format_version_are_pinned() -> None:
    assert SUPPORTED_VERSION == 2
    assert any('/ "ledger.json"' in text for text in _product_sources())
