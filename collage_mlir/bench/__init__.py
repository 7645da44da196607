"""`collage bench`: a collage-compiled model side by side with what a user would pick instead (PyTorch
eager, torch.compile, ONNX Runtime, OpenVINO, IREE alone, XLA), each in its own worker process, timed
interleaved in one run, checked against PyTorch eager (`jax.jit` for JAX models).

    contenders/   one file per contender: how its users set it up (worker side)
    tasks.py      what the worker processes run: reference, prepare, sample
    session.py    the orchestration: compile each contender, warm up, time round-robin
    report.py     JSON, markdown table, PNG chart
"""
