"""``make demo``: the whole loop on the embedded local stack (:mod:`frontier.demo.run`).

It sits above the targets, like the Fabric tasks: it loads its stack through the factory and rolls
releases through the stack's Backend, and drives the local target's own parts (``local.up``, its
group of slots, its gateway) where the demo shows them.
"""
