"""The runtime every per-item stage shares (no Dagster): the step runner (reuse, retries, failures as
rows), the engines that run its items (local or Ray), the sandboxed decode worker and its tasks."""
