"""``pulumi up -s <stack>``: build the environment described by ``stacks/Pulumi.<stack>.yaml``.

The settings come only from :func:`frontier.stack.load_stack`, the loader every Frontier tool uses.
The local stack is refused: it is never provisioned by Pulumi. Outputs are listed in
:class:`infra.outputs.StackOutputs`.
"""

import sys
from pathlib import Path

# Pulumi runs this file by path; make the repository importable even without an installed toolkit.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import pulumi  # noqa: E402

from frontier.errors import StackError  # noqa: E402
from frontier.stack import load_stack  # noqa: E402
from infra.errors import ProvisionError  # noqa: E402
from infra.program import build  # noqa: E402

try:
    settings = load_stack(pulumi.get_stack())
except StackError as exc:
    raise ProvisionError(str(exc)) from None

build(settings).export()
