"""dradriver: a Kubernetes Dynamic Resource Allocation driver (shared core)."""

__version__ = "0.1.0"
DEFAULT_DRIVER_NAME = "dradriver.dev"
