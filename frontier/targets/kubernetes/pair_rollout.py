"""Roll a release over a disaggregated pool's two Deployments: prefill first, then decode.

Each half goes through the whole Deployment rollout of :mod:`frontier.targets.kubernetes.rollout`
(its canary, its gate, its roll), with the release's one ``runtime.yaml`` and its own role. Why
this order:

- **The decode is the pair's client.** It connects to a prefill's listener and pulls; a prefill
  only answers. A new release is first a new listener for old decodes, as a server goes before
  its clients, and only then a new puller.
- **The decode's canary is gated on the pair the release will run.** Rolled second, its canary
  pulls from prefill pods already on the release, so its gate measures new prefill with new
  decode, end to end, before any stable decode pod changes.
- **A pair never stays mixed.** Between the two rolls old decodes pull from new prefills; a
  release that changed the cache's layout (block size, KV dtype, model) fails those pulls at
  their first line (the runtime compares layouts), and each decode then recomputes the prompt
  itself (``kv_transfer.on_failure: recompute``; ``fail`` answers 502 for that window). When the
  decode's rollout fails, the prefill is rolled back too, so the pool is never left on two
  releases.

With ``rollout.verify_canary`` each canary runs the verification set; the golden outputs recorded
from the old release for the prefill's canary hold the decode's too (one recording a release).
The result lists both halves' Deployments (prefill's canary and stable, then decode's).
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier.release.release import Release
from frontier.rollout.rolling import Event, RolloutResult
from frontier.targets.kubernetes.rollout import KubernetesRollout


@dataclass
class PairRollout:
    prefill: KubernetesRollout
    decode: KubernetesRollout

    def run(self, release: Release, kind: str = "deploy") -> RolloutResult:
        first = self.prefill.run(release, kind)
        if first.outcome != "succeeded":
            return first  # the prefill is back where it was, and no decode was touched
        # The golden outputs the prefill's canary recorded from the old release hold the decode's.
        self.decode.verification = self.prefill.verification
        second = self.decode.run(release, kind)
        result = RolloutResult(
            kind=kind,
            release=release.id,
            outcome=second.outcome,
            reason=second.reason,
            hosts=[*first.hosts, *second.hosts],
            duration_s=round(first.duration_s + second.duration_s, 3),
        )
        if second.outcome == "succeeded":
            return result
        # The decode is back on the previous release: so must the prefill be.
        stable = first.hosts[-1]
        self.prefill.report(
            Event(stable.name, "restore", "info", f"the decode failed: prefill back to {stable.from_release}")
        )
        if not self.prefill.undo(stable):
            result.outcome = "failed"
        return result
