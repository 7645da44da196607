#!/usr/bin/env bash
# The whole default suite: lit (IR a pass produces, error lines), pytest (numerics, CLI) two files at a
# time (a file's module fixtures stay in one process; each process has its own import cache) but for the
# tests marked serial (they compare times, or Ctrl-C a child mid-run: run alone, after), then the IREE
# conformance files, two at a time: each runs in its own process (nothing shared). test/python's
# folders mirror the package's stages (frontends/, graph/, backends/, measure/, search/, passes/, runtime/,
# tools/, ...; conformance/ is the corpora).
#
# While working: `python3 -m pytest -m fast` runs the compiler-free tier (no iree-compile, no engine
# build, no worker process) in seconds; `python3 -m pytest test/python/search` runs one stage's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
lit -sv test/lit
python3 -m pytest -q -n 2 --dist loadfile -m "not bench and not serial" test/python \
    --ignore=test/python/conformance/test_conformance.py
python3 -m pytest -q -m "serial and not bench" test/python --ignore=test/python/conformance/test_conformance.py
python3 -m pytest -q -n 2 test/python/conformance/test_conformance.py
