"""Running `fab` in process, through Fabric's own command-line program, as a user types it."""

from __future__ import annotations

import pytest
from fabric.main import program


def fab(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``fab *args``: its exit code, stdout and stderr."""
    try:
        program.run(["fab", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    out = capsys.readouterr()
    return code, out.out, out.err
