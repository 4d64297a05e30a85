"""Derive stage (no Dagster): annotations, shape-bucketed VAE latents and caption text embeddings
for selected clips, from saved context frames, the packet index and the clip reader."""
