"""Command line: the only package that prints or exits (`llmsim`, `python -m sim`)."""
