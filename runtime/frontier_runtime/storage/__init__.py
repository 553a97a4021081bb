"""Where the runtime gets what it needs at start: model weights (S3 + manifest) and secrets."""
