"""The studies that are not training runs of the engine, one folder each, named by the study:
profiler (B4), fused_conv (C, with its CUDA kernel in kernels/), lenet_memory (D1),
spare_failure (D2), float32_bytes (D3), sharding (D4), graphs (D5), spark_lazy (D6),
serialization (D7), collectives (A5 explained). In each, `measure.py` measures it and `spec.py`
declares it (dmls/study_spec.py); catalog.py registers them; runner.py runs any of them as a
rule's job; ranks.py starts a study's ranks."""


def error_line(exc: BaseException, qualified: bool = False) -> str:
    """An exception as a reader sees it: its type and its message's first line, e.g.
    "ValueError: Circular reference detected"; `qualified` names a type outside the builtins
    with its module ("struct.error")."""
    kind = type(exc)
    name = kind.__name__
    if qualified and kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    text = str(exc).strip().splitlines()
    return f"{name}: {text[0] if text else ''}".rstrip(": ")
