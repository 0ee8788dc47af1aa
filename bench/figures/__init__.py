"""The groups of ``python -m bench`` (see :mod:`bench.run`): each module measures one or two groups' figures in one
run, most of them ratios against a goal, and records them through the run's ``ctx.figure``."""
