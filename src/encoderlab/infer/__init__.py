"""Inference: embeddings now; pipelines, export and serving later."""
