"""The one error the program raises for settings it cannot provision."""

from __future__ import annotations

import pulumi

from frontier.errors import FrontierError


class ProvisionError(FrontierError, pulumi.RunError):
    """A stack that cannot be provisioned as written.

    Being a :class:`pulumi.RunError`, the CLI prints only the message (no traceback), in the tone of
    the stack loader's errors: the field path, its value, and what is allowed.
    """
