"""The kubelet-plugin framework: what every DRA node driver needs but its device logic.

A driver implements :class:`dradriver.plugin.interface.ClaimDriver` (prepare and
unprepare one claim, handle errors); :class:`dradriver.plugin.claims.ClaimRunner`
serves it to the kubelet's batches, validating each reference, holding the claim's
lock (:mod:`.claimlock`) and fetching the claim with the UID check (:mod:`.claimfetch`).
:class:`dradriver.plugin.helper.KubeletPluginHelper` owns the rest: the plugin
directory and sockets, the DRA v1/v1beta1 and dra-health gRPC services,
registration with the kubelet (and re-registration after kubelet restarts),
rolling-update socket names, and ResourceSlice publishing (``publish_resources``).
Device metadata files (KEP-5304) are :mod:`.devicemetadata`'s.
"""
