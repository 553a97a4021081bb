"""``pulumi up -s <stack>``: build the environment described by ``stacks/Pulumi.<stack>.yaml``.

The settings come only from :func:`frontier.config.load.load_stack`, the loader every Frontier tool uses.
The local stack is refused: it is never provisioned by Pulumi. Outputs are listed in
:class:`infra.outputs.StackOutputs`.
"""

# Pulumi runs this file by path with the project's .venv (Pulumi.yaml), where `make install` put
# the toolkit (frontier, infra, policy) as an editable install: plain imports find them.
import pulumi

from frontier.config.load import load_stack
from frontier.errors import StackError
from infra.errors import ProvisionError
from infra.program import build

try:
    settings = load_stack(pulumi.get_stack())
except StackError as exc:
    raise ProvisionError(str(exc)) from None

build(settings).export()
