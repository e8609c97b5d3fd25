"""The studies that are not training runs of the engine, one module each, named by the study:
profiler (B4), fused_conv (C, with its CUDA kernel in kernels/), lenet_memory (D1),
spare_failure (D2), float32_bytes (D3); runner.py runs any of them as a rule's job."""
