"""Studies: investigations that back the figures in docs/, one folder each (script, README, results).
Run from the repository root as modules, e.g. ``python -m studies.boundary.boundary``; ``studies.common``
holds what several of them share."""
