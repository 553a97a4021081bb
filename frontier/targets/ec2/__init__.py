"""The EC2 target: hosts found by their tags, reached over SSH, drained through an ALB target group,
grouped in an auto scaling group; AMIs pinned per node group."""
