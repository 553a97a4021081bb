"""The access layer, toolkit side: the gateway's config per stack, metering sums, batch jobs."""
