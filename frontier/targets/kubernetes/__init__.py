"""The Kubernetes target: manifests rendered from a stack's settings, the Deployment rolled through
the API server, pods read for status; the platform places, drains and scales them."""
