"""Calibration harness (needs PyTorch): measure a GPU profile and validate the simulator.

`calibrate` (microbenchmarks `bench`, whole iterations `itergrid`, written by
`output`) -> a profile folder; `reference` is a real serving engine with the
simulator's scheduling; `validate` compares the two. See docs/calibration.md.
Nothing here is imported by the simulator core.
"""
