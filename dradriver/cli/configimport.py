"""``dradriver config import FORMAT FILE``: another device plugin's configuration as ours.

Prints the driver configuration (YAML) on stdout, and on stderr each thing it could not
express (``lost: <input field>: ...``) and each assumption (``note: ...``); exit 0. Input that
cannot be read or is invalid prints the error naming the field and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from dradriver.devices.configyaml import MAX_CONFIG_BYTES
from dradriver.devices.importing import (
    ImportResult,
    import_generic_device_plugin,
    import_smarter_device_manager,
)
from dradriver.errors import FieldErrors

GENERIC_DEVICE_PLUGIN = "generic-device-plugin"
SMARTER_DEVICE_MANAGER = "smarter-device-manager"
INVALID_INPUT = 2


def _read(file: str) -> str:
    """The file's text, bounded like the driver configuration (the path may be a FIFO)."""
    try:
        with Path(file).open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise FieldErrors(f"cannot read it: {err.strerror}", subject=file) from err
    if len(data) > MAX_CONFIG_BYTES:
        raise FieldErrors(f"larger than {MAX_CONFIG_BYTES} bytes", subject=file)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FieldErrors(
            f"not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start}", subject=file
        ) from err


def cmd_import(args: argparse.Namespace) -> int:
    try:
        text = _read(args.file)
        if args.format == GENERIC_DEVICE_PLUGIN:
            result = import_generic_device_plugin(text, domain=args.domain, file=args.file)
        else:
            result = import_smarter_device_manager(text, file=args.file)
    except FieldErrors as err:
        print(f"dradriver config import: {err}", file=sys.stderr)
        return INVALID_INPUT
    _print(result, args.format, args.file)
    return 0


def _print(result: ImportResult, fmt: str, file: str) -> None:
    sys.stdout.write(f"# dradriver driver configuration imported from {fmt} ({file})\n")
    sys.stdout.write(yaml.safe_dump(result.config, sort_keys=False))
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    for loss in result.losses:
        print(f"lost: {loss}", file=sys.stderr)
    if result.losses:
        print(
            f"{len(result.losses)} setting(s) of {file} could not be expressed (lost: above)",
            file=sys.stderr,
        )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``config import generic-device-plugin|smarter-device-manager FILE``."""
    config = sub.add_parser("config", help="work with dradriver's driver configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    importer = config_sub.add_parser(
        "import",
        help="another device plugin's configuration as host device profiles",
        description="Reads a generic-device-plugin or smarter-device-manager configuration "
        "and prints the equivalent dradriver driver configuration (host sources) on stdout; "
        "what cannot be expressed is listed on stderr.",
    )
    formats = importer.add_subparsers(dest="format", required=True)
    gdp = formats.add_parser(GENERIC_DEVICE_PLUGIN, help="generic-device-plugin (squat)")
    gdp.add_argument("file", metavar="FILE", help="its config file (YAML)")
    gdp.add_argument(
        "--domain",
        help="the resource domain it used (default: the file's domain, else devic.es; "
        "releases before 0.2.0 used squat.ai)",
    )
    gdp.set_defaults(func=cmd_import)
    sdm = formats.add_parser(SMARTER_DEVICE_MANAGER, help="smarter-device-manager")
    sdm.add_argument("file", metavar="FILE", help="its conf.yaml")
    sdm.set_defaults(func=cmd_import, domain=None)
