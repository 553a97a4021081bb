"""Tasks of this area are added to the namespace by ``register``."""

from invoke import Collection


def register(namespace: Collection) -> None:
    pass
