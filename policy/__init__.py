"""Frontier's Pulumi policy pack: guardrails that every stack's resources must pass."""
