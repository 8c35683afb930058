"""Claims: immediate allocation, the conflict hold and fence claims.

Shared with the controller's other reconcilers: :mod:`~controller.claims.allocation`
(pure claim helpers, the names of our claim annotations and finalizers) and
:mod:`~controller.claims.fences` (what a fence claim is). The other modules are the
parts of :class:`~controller.claims.reconciler.ClaimReconciler`.
"""
