"""No command of this project talks to the network: engines' usage telemetry is switched off here.

``import openvino`` imports its model converter, which sends an "import" event to an analytics host through
``openvino_telemetry`` (seen: a DNS query on every ``collage`` command). OpenVINO falls back to its own
no-op stub when that package cannot be imported, so it is made unimportable before OpenVINO loads.
"""

from __future__ import annotations

import sys


def disable_engine_telemetry() -> None:
    """Makes ``openvino_telemetry`` unimportable, unless something imported it already."""
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
