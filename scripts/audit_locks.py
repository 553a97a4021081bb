"""`make audit`: pip-audit over every lock file, one line each; exits 1 when an audit that ran
found a known vulnerability. An audit that could not ask about every package says it did not run
and why (frontier.release.sbom): it fails nothing, and claims nothing either."""

from __future__ import annotations

import sys

from frontier import project
from frontier.release.sbom import ensure_tools, run_audit


def main() -> int:
    tools = ensure_tools()
    found = 0
    for lock in sorted((project.root() / "requirements").glob("*.txt")):
        audit = run_audit(lock, tools)
        print(f"{lock.relative_to(project.root())}: {audit.summary()}")
        for finding in audit.findings:
            print(
                f"  {finding.package} {finding.version} {finding.id} ({finding.severity}); fixed in {', '.join(finding.fix_versions) or '-'}"
            )
        found += len(audit.findings)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
