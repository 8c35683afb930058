"""The ``host`` device source: real host device nodes served by profile.

One profile (``sources[i].host``) makes devices out of /dev nodes: /dev/kvm shared by a
count, serial and USB devices one per match named by a stable identity, groups of nodes
that make one device. Modules, one concept each:

* :mod:`.config` - the profile's configuration model and its validation
* :mod:`.sysfs` - pure readers of sysfs and /dev (subsystem, numbers, USB ancestor, links)
* :mod:`.identity` - a match's stable identity and the device name made from it
* :mod:`.discovery` - one scan of a profile: matches paired into groups, with attributes
* :mod:`.slots` - a shared device published as consumable capacity or as N slot devices
* :mod:`.source` - :class:`~.source.HostDeviceSource`, which remembers devices it has seen
* :mod:`.watch` - inotify hot-plug events that tell the owner which profile to rescan
"""
