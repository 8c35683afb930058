"""Claims: immediate allocation, the conflict hold and fence claims.

The modules are the parts of :class:`~controller.claims.reconciler.ClaimReconciler`;
what the controller's other reconcilers also read about claims (paths, consumers, node,
fence label) is in :mod:`controller.resourceclaims`.
"""
