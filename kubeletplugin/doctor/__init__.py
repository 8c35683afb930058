"""Node checks for serving host devices: is this node ready for the driver's configuration?

* :mod:`~kubeletplugin.doctor.model` - :class:`Roots`, :class:`Needs`, :class:`CheckResult`
* :mod:`~kubeletplugin.doctor.runtime` - the container runtime applies CDI
* :mod:`~kubeletplugin.doctor.node` - cgroups, CDI directories, kernel modules and nodes,
  AppArmor, loop devices, configured paths
* :mod:`~kubeletplugin.doctor.checks` - :func:`run_checks`, all of them
* :mod:`~kubeletplugin.doctor.table` - :func:`format_table`

The checks are pure reads under configurable roots, so they run the same on a node, in the
plugin's pod (host filesystems mounted under a directory: :meth:`Roots.under`) and in tests.
"""

from kubeletplugin.doctor.checks import run_checks
from kubeletplugin.doctor.model import CheckResult, Needs, Roots
from kubeletplugin.doctor.table import format_table

__all__ = ["CheckResult", "Needs", "Roots", "format_table", "run_checks"]
