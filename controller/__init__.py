"""dradriver's control-plane component (allocation, network-attached pools)."""
