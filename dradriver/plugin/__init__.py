"""The kubelet-plugin framework: what every DRA node driver needs but its device logic.

A driver implements :class:`dradriver.plugin.interface.DRADriver` (prepare,
unprepare, handle errors). :class:`dradriver.plugin.helper.KubeletPluginHelper`
owns the rest: the plugin directory and sockets, the DRA v1/v1beta1 and
dra-health gRPC services, registration with the kubelet (and re-registration
after kubelet restarts), rolling-update socket names, and ResourceSlice
publishing.
"""
