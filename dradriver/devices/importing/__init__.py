"""Importers: configurations of other device plugins as dradriver ``host`` profiles.

* :mod:`~dradriver.devices.importing.result` - :class:`ImportResult` and shared helpers
* :mod:`~dradriver.devices.importing.genericdeviceplugin` - generic-device-plugin
* :mod:`~dradriver.devices.importing.smarterdevicemanager` - smarter-device-manager
* :mod:`~dradriver.devices.importing.regexglob` - simple regular expressions as globs

Each importer takes the other plugin's configuration text and returns a driver configuration
document (``{"sources": [{"host": {...}}, ...]}``, camelCase keys) with the list of what it
could not express; bad input raises :class:`~dradriver.errors.FieldErrors` naming the field.
"""

from dradriver.devices.importing.genericdeviceplugin import import_generic_device_plugin
from dradriver.devices.importing.result import ImportResult
from dradriver.devices.importing.smarterdevicemanager import import_smarter_device_manager

__all__ = ["ImportResult", "import_generic_device_plugin", "import_smarter_device_manager"]
