"""The dradriver image, built without a registry (see :mod:`devtools.image.build`)."""
