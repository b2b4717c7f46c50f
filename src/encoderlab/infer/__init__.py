"""Inference: the pipelines (pipelines.py: pipeline() loads the Pipeline each capability's card names, beside its task),
precision and the runtime engines (precision.py, backends.py), torch.compile (compiled.py), ONNX export (onnx.py)
and the HTTP server (server.py, its limits in limits.py): requests batched together (batching.py), the OpenAI- and
TEI-compatible routes (compat.py) and Prometheus' /metrics (metrics.py)."""
