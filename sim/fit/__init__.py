"""Fitting the simulator to real runs: runtime host terms from iteration grids
(`runtime_fit`) and from live serving logs (`logfit`, `servinglog`), a real run's logs
replayed through the simulator (`replay`), and measured kernel data converted into
profiles (`profile_convert`).
"""
