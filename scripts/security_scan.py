"""``make scan``: checkov, a peer scanner, over what Frontier ships.

* every stack's Kubernetes manifests, rendered as ``fab render`` renders them (the backend's own
  renderer, the placeholder digest: the stack's ``kubernetes.image`` then pins the runtime);
* every Dockerfile and Containerfile in the tree (``runtime/Dockerfile`` today);
* the Pulumi programs' policy documents: each stack the program provisions is run under the test suite's
  mocks (as ``pulumi up`` runs ``infra/__main__.py``), and its IAM roles, role policies, managed policies,
  KMS key policies and S3 bucket policies are written out as a CloudFormation template, the form in which
  checkov evaluates IAM documents offline (admin, wildcard principals, privilege escalation, data
  exfiltration, write without constraints). The rest of the Pulumi graph (buckets, security groups,
  load balancers) has no faithful CloudFormation shape here and is held by the policy pack (policy/).

Exceptions live on the object they excuse: ``checkov.io/skipN: CHECK=reason`` annotations on one
Kubernetes object, ``# checkov:skip=CHECK:reason`` in one Dockerfile. This script passes checkov no
skip of its own, refuses an exception without a reason, and prints every exception it met.

Exit status: 0 when nothing failed, 1 when a check failed, 2 when something could not be rendered or
scanned (a parse error is never a pass).

    .venv/bin/python scripts/security_scan.py [--checkov PATH] [--keep DIR] [--only DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHECKOV = ROOT / ".frontier" / "checkov-venv" / "bin" / "checkov"
FRAMEWORKS = ("kubernetes", "dockerfile", "cloudformation")
NO_REASON = "No comment provided"  # what checkov records for a skip without one


class ScanError(Exception):
    """Something could not be rendered or scanned: the scan proves nothing about it."""


# --- what is scanned -------------------------------------------------------------------------------


def stack_names() -> list[str]:
    from frontier import project

    return sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml")
        for p in project.stacks_dir().glob("Pulumi.*.yaml")
    )


def render_manifests(out: Path) -> list[str]:
    """Each stack's Kubernetes manifests under ``out/<stack>/``; the stacks that have any."""
    from frontier_hostside.names import PLACEHOLDER_DIGEST

    from frontier.targets import backend_for, load_stack

    found = []
    for stack in stack_names():
        try:
            files = backend_for(load_stack(stack)).rendered_files(PLACEHOLDER_DIGEST)
        except Exception as exc:  # a stack that does not render is not scanned: say so, fail
            raise ScanError(f"stack {stack}: its manifests do not render: {exc}") from exc
        manifests = {rel: text for rel, text in files.items() if rel.endswith((".yaml", ".yml"))}
        for rel, text in manifests.items():
            path = out / stack / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if manifests:
            found.append(stack)
    return found


def container_files() -> list[str]:
    """Every Dockerfile/Containerfile git knows of (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()

    def is_container_file(name: str) -> bool:
        name = name.lower()
        return any(
            name == n or name.startswith(n + ".") or name.endswith("." + n)
            for n in ("dockerfile", "containerfile")
        )

    return sorted({rel for rel in listed if is_container_file(Path(rel).name) and (ROOT / rel).is_file()})


def _document(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _logical_id(name: str, taken: set[str]) -> str:
    base = (
        "".join(part.capitalize() for part in "".join(c if c.isalnum() else " " for c in name).split()) or "R"
    )
    logical, n = base, 1
    while logical in taken:
        n += 1
        logical = f"{base}{n}"
    taken.add(logical)
    return logical


def _lift_exceptions(
    document: dict[str, Any], exceptions: dict[str, dict[str, str]]
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any], dict[str, str]]]]:
    """``document`` without the statements that carry an exception, and those, each on its own."""
    kept, lifted = [], []
    for statement in document.get("Statement", []):
        sid = statement.get("Sid", "")
        if sid in exceptions:
            lifted.append((sid, {**document, "Statement": [statement]}, exceptions[sid]))
        else:
            kept.append(statement)
    return {**document, "Statement": kept}, lifted


def _kms_key(policy: Any, key: dict[str, Any]) -> dict[str, Any]:
    """A KMS key's CloudFormation properties: ``policy``, with rotation and spec from the key's inputs."""
    return {
        "KeyPolicy": _document(policy),
        "EnableKeyRotation": bool(key.get("enableKeyRotation")),
        # What checkov reads to tell an asymmetric key (which KMS cannot rotate) from one it can.
        "KeySpec": key.get("customerMasterKeySpec") or key.get("keySpec") or "SYMMETRIC_DEFAULT",
        "KeyUsage": key.get("keyUsage") or "ENCRYPT_DECRYPT",
    }


def cloudformation_of(
    resources: Iterable[Any], exceptions: dict[str, dict[str, str]] | None = None
) -> dict[str, Any]:
    """The policy-bearing resources of a Pulumi graph as CloudFormation, attribute for attribute.

    A statement whose Sid has an entry in ``exceptions`` (``frontier.identity.documents.CHECKOV_EXCEPTIONS``) becomes a
    policy of its own carrying the skip, so the rest of its document is still held to every check.
    """
    resources, exceptions = list(resources), exceptions or {}
    attached: dict[str, list[str]] = defaultdict(list)
    for r in resources:
        if r.type == "aws:iam/rolePolicyAttachment:RolePolicyAttachment":
            attached[r.inputs["role"]].append(r.inputs["policyArn"])
    keys_by_id = {r.outputs.get("keyId"): r.inputs for r in resources if r.type == "aws:kms/key:Key"}
    template: dict[str, Any] = {}
    taken: set[str] = set()
    for r in resources:
        i = r.inputs
        if r.type == "aws:iam/role:Role":
            role_name = r.outputs.get("name") or r.id
            props: dict[str, Any] = {
                "RoleName": role_name,
                "AssumeRolePolicyDocument": _document(i["assumeRolePolicy"]),
            }
            inline = [p for p in i.get("inlinePolicies") or [] if p.get("policy")]
            if inline:
                props["Policies"] = [
                    {"PolicyName": p.get("name") or "inline", "PolicyDocument": _document(p["policy"])}
                    for p in inline
                ]
            arns = [*(i.get("managedPolicyArns") or []), *attached.get(role_name, [])]
            if arns:
                props["ManagedPolicyArns"] = arns
            kind = "AWS::IAM::Role"
        elif r.type == "aws:iam/rolePolicy:RolePolicy":
            document, lifted = _lift_exceptions(_document(i["policy"]), exceptions)
            for sid, alone, skips in lifted:
                template[_logical_id(f"{r.name}-{sid}", taken)] = {
                    "Type": "AWS::IAM::Policy",
                    "Metadata": {
                        "PulumiUrn": r.urn,
                        "checkov": {"skip": [{"id": c, "comment": why} for c, why in skips.items()]},
                    },
                    "Properties": {
                        "PolicyName": f"{r.name}-{sid}",
                        "PolicyDocument": alone,
                        "Roles": [i["role"]],
                    },
                }
            props = {"PolicyName": i.get("name") or r.name, "PolicyDocument": document, "Roles": [i["role"]]}
            kind = "AWS::IAM::Policy"
        elif r.type == "aws:iam/policy:Policy":
            props = {"ManagedPolicyName": i.get("name") or r.name, "PolicyDocument": _document(i["policy"])}
            kind = "AWS::IAM::ManagedPolicy"
        elif r.type == "aws:kms/key:Key" and i.get("policy"):
            props, kind = _kms_key(i["policy"], i), "AWS::KMS::Key"
        elif r.type == "aws:kms/keyPolicy:KeyPolicy":
            # A key whose policy is a resource of its own (the release key's names the deploy role,
            # made after the key): CloudFormation has the policy on the key, with the key's spec.
            props, kind = _kms_key(i["policy"], keys_by_id.get(i["keyId"], {})), "AWS::KMS::Key"
        elif r.type == "aws:s3/bucketPolicy:BucketPolicy":
            props = {"Bucket": i["bucket"], "PolicyDocument": _document(i["policy"])}
            kind = "AWS::S3::BucketPolicy"
        else:
            continue
        template[_logical_id(r.name, taken)] = {
            "Type": kind,
            "Metadata": {"PulumiUrn": r.urn},
            "Properties": props,
        }
    return {"AWSTemplateFormatVersion": "2010-09-09", "Resources": template}


def render_pulumi_documents(out: Path) -> list[str]:
    """Each provisioned stack's policy documents as ``out/<stack>/policies.template.json``."""
    for path in (str(ROOT), str(ROOT / "tests" / "infra")):
        if path not in sys.path:
            sys.path.insert(0, path)
    from k8s_mocks import run_kubernetes  # EKS's account answers the EC2 program's invokes too

    from frontier.identity.documents import CHECKOV_EXCEPTIONS
    from frontier.targets import load_stack
    from infra.errors import ProvisionError
    from infra.program import refuse_local

    found = []
    for stack in stack_names():
        try:
            settings = load_stack(stack)
            try:
                refuse_local(settings)
            except ProvisionError:
                continue  # never provisioned by Pulumi
            graph = run_kubernetes(settings, entry_point=True)
        except Exception as exc:
            raise ScanError(f"stack {stack}: the Pulumi program does not run under mocks: {exc}") from exc
        template = cloudformation_of(graph.resources, CHECKOV_EXCEPTIONS)
        if not template["Resources"]:
            raise ScanError(f"stack {stack}: the Pulumi program declared no policy document to scan")
        (out / stack).mkdir(parents=True, exist_ok=True)
        (out / stack / "policies.template.json").write_text(json.dumps(template, indent=2, sort_keys=True))
        found.append(stack)
    return found


# --- checkov and its report ------------------------------------------------------------------------


@dataclass
class Tally:
    passed: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    resources: set[str] = field(default_factory=set)


def run_checkov(checkov: Path, directory: Path) -> list[dict[str, Any]]:
    # It runs in the rendered folder: a path given relative to the repository must not be read from there.
    checkov = checkov.resolve()
    if not checkov.exists():
        raise ScanError(f"{checkov} does not exist: `make scan` installs it (tools/checkov/requirements.txt)")
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_NO_OUTPUT_COLOR": "1", "LOG_LEVEL": "ERROR"}
    done = subprocess.run(
        [
            str(checkov),
            "--directory",
            str(directory),
            "--framework",
            *FRAMEWORKS,
            "--output",
            "json",
            "--skip-download",  # offline: no guideline or policy download
            "--download-external-modules",
            "false",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=directory,
    )
    if done.returncode not in (0, 1):
        raise ScanError(f"checkov exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise ScanError(f"checkov wrote no JSON report: {done.stdout[:500]!r} {done.stderr[-2000:]}") from exc
    reports = report if isinstance(report, list) else [report]
    # With nothing to scan checkov prints an empty summary instead of a report.
    return [r for r in reports if isinstance(r, dict) and "results" in r]


def tally(reports: list[dict[str, Any]], scanned: Path) -> dict[str, Tally]:
    """Results by target: ``kubernetes/<stack>``, ``pulumi/<stack>``, ``dockerfile/<path>``."""
    found: dict[str, Tally] = defaultdict(Tally)
    for report in reports:
        errors = report.get("results", {}).get("parsing_errors") or report.get("summary", {}).get(
            "parsing_errors"
        )
        if errors:
            raise ScanError(f"checkov could not parse: {errors}")
        for key, kind in (
            ("passed_checks", "passed"),
            ("failed_checks", "failed"),
            ("skipped_checks", "skipped"),
        ):
            for result in report["results"].get(key, []):
                parts = Path(result["file_path"].lstrip("/")).parts
                target = (
                    f"{parts[0]}/{parts[1]}"
                    if parts[0] != "dockerfile"
                    else "dockerfile/" + "/".join(parts[1:])
                )
                entry = found[target]
                entry.resources.add(result["resource"])
                if kind == "passed":
                    entry.passed += 1
                else:
                    getattr(entry, kind).append(result)
    return dict(found)


def _reason(result: dict[str, Any]) -> str:
    return str((result.get("check_result") or {}).get("suppress_comment") or "").strip()


def summarise(found: dict[str, Tally], expected: list[str]) -> tuple[str, int]:
    lines, status = [], 0
    missing = [t for t in expected if t not in found]
    width = max([len(t) for t in found] + [20])
    lines.append(f"{'target':<{width}}  {'resources':>9}  {'passed':>6}  {'failed':>6}  {'skipped':>7}")
    for target in sorted(found):
        t = found[target]
        lines.append(
            f"{target:<{width}}  {len(t.resources):>9}  {t.passed:>6}  {len(t.failed):>6}  {len(t.skipped):>7}"
        )
    total_failed = sum(len(t.failed) for t in found.values())
    lines.append(
        f"{'total':<{width}}  {sum(len(t.resources) for t in found.values()):>9}  "
        f"{sum(t.passed for t in found.values()):>6}  {total_failed:>6}  "
        f"{sum(len(t.skipped) for t in found.values()):>7}"
    )

    exceptions: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    for target, t in found.items():
        for s in t.skipped:
            kind, _, rest = target.partition("/")
            where = "runtime image" if kind == "dockerfile" else kind
            exceptions[
                (s["check_id"], s["resource"] if kind != "dockerfile" else rest, _reason(s), where)
            ].append(rest)
    lines.append("")
    lines.append(f"inline exceptions ({len(exceptions)}), each on the object it excuses:")
    for (check, resource, reason, _), targets in sorted(exceptions.items()):
        lines.append(f"  {check:<12} {resource}  [{', '.join(sorted(targets))}]")
        lines.append(f"  {'':<12} reason: {reason or '(none)'}")
    unexplained = [key for key in exceptions if not key[2] or key[2] == NO_REASON]
    if unexplained:
        status = 1
        lines.append("")
        lines.append(
            "FAILED: exceptions without a reason: " + ", ".join(f"{c} on {r}" for c, r, _, _ in unexplained)
        )

    if total_failed:
        status = 1
        lines.append("")
        lines.append(f"FAILED: {total_failed} check(s):")
        for target in sorted(found):
            for f in found[target].failed:
                lines.append(
                    f"  {target}: {f['check_id']} {f['check_name']} -- {f['resource']} ({f['file_path']})"
                )
    if missing:
        status = 2
        lines.append("")
        lines.append("ERROR: checkov reported nothing for: " + ", ".join(missing))
    return "\n".join(lines), status


def checkov_version(checkov: Path) -> str:
    return subprocess.run([str(checkov), "--version"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkov", type=Path, default=CHECKOV, help="the pinned checkov (default: %(default)s)"
    )
    parser.add_argument(
        "--keep", type=Path, help="render into this folder and keep it (default: a temporary one)"
    )
    parser.add_argument(
        "--only",
        type=Path,
        help="scan the Kubernetes manifests in this folder instead of the stacks' (a control)",
    )
    args = parser.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="frontier-scan-"))
    if args.keep and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        expected: list[str] = []
        if args.only:
            shutil.copytree(args.only, work / "kubernetes" / args.only.name)
            expected.append(f"kubernetes/{args.only.name}")
        else:
            expected += [f"kubernetes/{s}" for s in render_manifests(work / "kubernetes")]
            for rel in container_files():
                (work / "dockerfile" / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, work / "dockerfile" / rel)
                expected.append(f"dockerfile/{rel}")
            expected += [f"pulumi/{s}" for s in render_pulumi_documents(work / "pulumi")]
        found = tally(run_checkov(args.checkov, work), work)
    except ScanError as exc:
        print(f"scan: ERROR: {exc}", file=sys.stderr)
        return 2
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text, status = summarise(found, expected)
    print(
        f"checkov {checkov_version(args.checkov)} ({', '.join(FRAMEWORKS)}), no skip passed on its command line"
    )
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
