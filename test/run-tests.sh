#!/usr/bin/env bash
# The whole default suite: lit (IR a pass produces, error lines), pytest (numerics, CLI), then the IREE
# conformance files, two at a time: each runs in its own process (nothing shared), and they are most of
# the suite's time.
set -euo pipefail
cd "$(dirname "$0")/.."
lit -sv test/lit
python3 -m pytest -q test/python --ignore=test/python/test_conformance.py
python3 -m pytest -q -n 2 test/python/test_conformance.py
