"""dropless.gpu: the GPU-side tools, built on the package (doc/adapters.md,
doc/reference_layer.md). Nothing here is imported by `import dropless`;
each module needs its framework (PyTorch or JAX) only when imported.

  adapters.torch_adapter   PyTorch MoE layers -> candidate files (python -m ...)
  adapters.jax_adapter     JAX MoE layers -> candidate files
  adapters.ep_layout       the expert-parallel dispatch layout (DeepEP's), checked
  adapters.common          what the adapters share: FUSED_STAGES, Result, emit
  adapters.h5io            the h5py reader and writer: the explicit fallback where
                           the library cannot load (DROPLESS_H5PY_FALLBACK=1)
  adapters.report          reports -> one markdown table
  reference_layer          the PyTorch reference layer (grouped GEMMs, dispatch,
                           backward) and its timing (python -m dropless.gpu.reference_layer)
  ep_dispatch              expert-parallel dispatch over torch.distributed (gloo, NCCL)
  pipeline_checks          host syncs, CUDA graph capture and replay, determinism
  pipeline_report          pipeline results -> markdown

Every tool runs on the CPU (PyTorch's CPU backend, gloo, JAX on CPU) and
is tested there; what needs a GPU (CUDA graphs, NCCL, Triton for sm_90,
torch._grouped_mm on Hopper) is skipped there and says so, and runs on the
device through tools/gpu_report.py.
"""
