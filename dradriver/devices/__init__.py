"""The device layer: what devices this node has and how they are published.

* :mod:`~dradriver.devices.model` - :class:`Device`, :class:`CounterSet` and their parts
* :mod:`~dradriver.devices.attributes` - typed attribute values
* :mod:`~dradriver.devices.config` - the driver configuration file
* :mod:`~dradriver.devices.sources` - the source interface, ``build_sources``, ``discover_all``;
  the sources themselves are :mod:`static`, :mod:`devglob` and :mod:`pci`
* :mod:`~dradriver.devices.health` - health from files
* :mod:`~dradriver.resourceslice.builder` - ResourceSlices for a node

Kubernetes quantities and name formats, which the API types, CEL, the allocator and the
webhook share with this package, are :mod:`dradriver.k8s.quantity` and
:mod:`dradriver.k8s.names`.
"""
