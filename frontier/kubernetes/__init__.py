"""The Kubernetes target: manifests rendered from a stack's settings, and where they may run from."""
