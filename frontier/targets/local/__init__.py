"""The local target: the embedded stack on this machine (moto, host slots on loopback aliases over
SSH or a local connection, HAProxy), its group of slots, its autoscaler and its gateway process."""
