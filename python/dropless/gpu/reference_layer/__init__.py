"""A reference dropless MoE layer in PyTorch (layer.py, gemm.py), its
candidate files for `dropless check` (run.py), and the CPU/GPU
pipeline checks and timing that python/dropless/gpu/pipeline_checks.py runs. See
doc/reference_layer.md."""
