"""One-off investigations, each its own command (``python -m bench.studies.NAME``): what a part costs or how well
it does, measured once to make a decision; not part of ``python -m bench``."""
