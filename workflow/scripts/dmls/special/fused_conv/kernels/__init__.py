"""Custom kernels: C++/CUDA sources next to the Python that compiles, wraps and checks them."""
