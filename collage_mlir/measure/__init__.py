"""Measurement: region extraction, reference inputs, timing in worker processes, validation against
the reference, and the persistent cost database.

The harness measures the regions it is handed (``harness.measure_regions``) and knows nothing of how a
search found them. Each candidate is built the way a plan builds it (the compile driver, one region on
one backend) and timed in a worker process, so a backend that crashes or hangs costs one candidate.
"""

#: Bumped whenever a change to extraction, timing or validation makes older rows incomparable, and when
#: the runtime's engine settings change what a region costs (2: small oneDNN regions on one thread, ORT
#: spinning as a program's sole engine; 3: graph engines' regions embed the constants only they read; 4: a model
#: computing in bf16 is also checked against its exact arithmetic, which turns some of its wrong rows right).
HARNESS_VERSION = 4
