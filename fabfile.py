"""`fab` entry point. Every task takes --stack/-s (default $FRONTIER_STACK, else `local`)."""

from frontier.cli import namespace  # noqa: F401  (Fabric looks for `namespace` here)
