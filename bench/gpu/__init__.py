"""The GPU check: what a lent GPU machine needs carried (``prepare``), and the extract and featurize figures
measured there (``check``, run by ``run.sh``). See bench/README.md, "GPU check"."""
