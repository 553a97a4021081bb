"""Errors an operator reads. Each names what was wrong and where; tasks turn them into exit codes."""


class FrontierError(Exception):
    """Base for every error a task reports to the operator without a traceback."""


class StackError(FrontierError):
    """A stack file that cannot be used: missing, unparsable, or a value out of range."""
