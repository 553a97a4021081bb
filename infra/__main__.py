"""``pulumi up -s <stack>``: build the environment described by ``stacks/Pulumi.<stack>.yaml``.

The settings come only from :func:`frontier.targets.load_stack`, the loader every Frontier tool uses.
The local stack is refused: it is never provisioned by Pulumi. Outputs are the fields of
:class:`frontier.config.outputs.Ec2Outputs` or :class:`~frontier.config.outputs.KubernetesOutputs`.
"""

# Pulumi runs this file by path with the project's .venv (Pulumi.yaml), where `make install` put
# the toolkit (frontier, infra, policy) as an editable install: plain imports find them.
import pulumi

from frontier.errors import StackError
from frontier.targets import load_stack
from infra.errors import ProvisionError
from infra.outputs import export
from infra.program import build

try:
    settings = load_stack(pulumi.get_stack())
except StackError as exc:
    raise ProvisionError(str(exc)) from None

export(build(settings))
