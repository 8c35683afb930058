"""dradriver's node component (DRA kubelet plugin and device-plugin shim)."""
