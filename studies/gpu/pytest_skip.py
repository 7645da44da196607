"""pytest plugin for the GPU machine, which has IREE's runtime but not its compiler: a test file whose
collection fails only because ``iree.compiler`` (or ``torch_mlir``) cannot be imported is reported as
skipped with that reason, not as a collection error. ``python -m pytest -p studies.gpu.pytest_skip ...``"""

from __future__ import annotations

import re

import pytest

#: What Python says when the compiler is absent (not installed; or hidden with sys.modules[name] = None).
MISSING = re.compile(r"No module named '(iree\.compiler|torch_mlir)[\w.]*'|import of (iree\.compiler|torch_mlir)\S* halted")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.failed and getattr(collector, "path", None) is not None:
        found = MISSING.search(str(report.longrepr))
        if found:
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), 0,
                               f"Skipped: {found.group(1) or found.group(2)} is not installed here (IREE runtime only)")
