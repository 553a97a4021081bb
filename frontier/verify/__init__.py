"""Whether the answers are still right: a fixed verification set run against an endpoint.

A set (``stacks/verify/default.yaml`` unless the stack names another in ``verify.file``) holds
cases of six kinds — normal requests, over-long inputs, bad inputs, structured output,
conversations and golden outputs — and a run scores each case pass or fail, or, for a golden case
with nothing recorded yet, not recorded (left out of the pass rate). ``fab verify`` prints
the report; a rollout's canary calls :func:`run_set` the same way and compares the pass rate with
``verify.min_pass_rate``.
"""

from frontier.verify.cases import KINDS, GoldenOutput, VerifySet
from frontier.verify.load import (
    Recording,
    VerifySetError,
    golden_path,
    golden_text,
    load_set,
    read_set,
    set_file,
    write_golden,
)
from frontier.verify.report import CaseResult, VerifyReport, kind_tables, summary_table
from frontier.verify.run import RecordError, record_golden, run_set

__all__ = [
    "KINDS",
    "CaseResult",
    "GoldenOutput",
    "RecordError",
    "Recording",
    "VerifyReport",
    "VerifySet",
    "VerifySetError",
    "golden_path",
    "golden_text",
    "kind_tables",
    "load_set",
    "read_set",
    "record_golden",
    "run_set",
    "set_file",
    "summary_table",
    "write_golden",
]
