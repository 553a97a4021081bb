"""The base of the stack's components whose methods make their children."""

from __future__ import annotations

from typing import Generic, TypeVar

import pulumi

ArgsT = TypeVar("ArgsT")


class Component(pulumi.ComponentResource, Generic[ArgsT]):
    """A component that keeps, for the methods making its children, its name (their names' prefix),
    its args and the options that make a resource its child."""

    def __init__(self, type_: str, name: str, args: ArgsT, opts: pulumi.ResourceOptions | None) -> None:
        super().__init__(type_, name, None, opts)
        self._name, self._args = name, args
        self._child = pulumi.ResourceOptions(parent=self)
