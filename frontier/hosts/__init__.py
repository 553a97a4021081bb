"""What the host targets (local and EC2) share: a host, an SSH connection to it, the host agent
driven over that connection, the balancer seam a host rollout drains through, host boots, drivers.

It sits below the rollout (which visits hosts) and above config, render and release (whose files
it puts on hosts); no target lives here.
"""
