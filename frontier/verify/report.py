"""What a verification run found: one result per case, summed per case kind, and the tables a
user reads."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from rich.table import Table

from frontier.verify.cases import KINDS


class CaseResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    kind: str
    passed: bool
    #: Why it failed, or what it saw when it passed (status, finish reason, tokens).
    why: str
    seconds: float
    #: A golden case with no recorded output to compare with: neither passed nor failed.
    unrecorded: bool = False


class KindSummary(BaseModel):
    kind: str
    cases: int
    passed: int
    failing: tuple[CaseResult, ...]
    unrecorded: int = 0

    @property
    def failed(self) -> int:
        return len(self.failing)


class VerifyReport(BaseModel):
    """A run of one set against one endpoint."""

    model_config = ConfigDict(frozen=True)

    endpoint: str
    model: str
    source: str
    results: tuple[CaseResult, ...]

    @property
    def ran(self) -> tuple[CaseResult, ...]:
        """The cases judged: every case but the golden ones with nothing recorded."""
        return tuple(r for r in self.results if not r.unrecorded)

    @property
    def unrecorded(self) -> tuple[CaseResult, ...]:
        return tuple(r for r in self.results if r.unrecorded)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def pass_rate(self) -> float:
        """Passed over the cases judged (0 when none was)."""
        return self.passed / len(self.ran) if self.ran else 0.0

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        return tuple(r for r in self.ran if not r.passed)

    def by_kind(self) -> list[KindSummary]:
        """One summary per kind the set has, in the order of ``KINDS``."""
        out = []
        for kind in KINDS:
            results = [r for r in self.results if r.kind == kind]
            if results:
                failing = tuple(r for r in results if not r.passed and not r.unrecorded)
                unrecorded = sum(r.unrecorded for r in results)
                out.append(
                    KindSummary(
                        kind=kind,
                        cases=len(results),
                        passed=len(results) - len(failing) - unrecorded,
                        failing=failing,
                        unrecorded=unrecorded,
                    )
                )
        return out


def kind_tables(report: VerifyReport) -> list[Table]:
    """One table per case kind: every case, passed or failed, and why."""
    tables = []
    for summary in report.by_kind():
        title = f"{summary.kind}: {summary.cases} cases, {summary.passed} passed, {summary.failed} failed"
        if summary.unrecorded:
            title += f", {summary.unrecorded} not yet recorded"
        table = Table(title=title, title_justify="left")
        table.add_column("case")
        table.add_column("result")
        table.add_column("why", overflow="fold")
        table.add_column("s", justify="right")
        for r in (r for r in report.results if r.kind == summary.kind):
            result = "[green]pass[/]" if r.passed else "[red]FAIL[/]"
            if r.unrecorded:
                result = "[yellow]not recorded[/]"
            table.add_row(r.name, result, r.why, f"{r.seconds:.2f}")
        tables.append(table)
    return tables


def summary_table(report: VerifyReport) -> Table:
    table = Table(title=f"verify {report.model} at {report.endpoint} ({report.source})", title_justify="left")
    columns = ("kind", "left"), ("cases", "right"), ("passed", "right"), ("failed", "right")
    for name, justify in (*columns, ("not recorded", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("failing", overflow="fold")
    for s in report.by_kind():
        table.add_row(
            s.kind,
            str(s.cases),
            str(s.passed),
            str(s.failed),
            str(s.unrecorded),
            ", ".join(r.name for r in s.failing),
        )
    table.add_row(
        "all",
        str(len(report.results)),
        str(report.passed),
        str(len(report.failures)),
        str(len(report.unrecorded)),
        "",
        style="bold",
    )
    return table
