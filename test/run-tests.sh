#!/usr/bin/env bash
# The whole default suite: lit (IR a pass produces, error lines) then pytest (numerics, conformance, CLI).
set -euo pipefail
cd "$(dirname "$0")/.."
lit -sv test/lit
python3 -m pytest -q test/python
