"""The simulation: a replica built from a scenario in one place (`build`, `memory`),
its state changes (`replica`, `moves`) beside its KV accounting (`kvaccount`), its record
(`recorder`) and its port to the fleet (`port`, `handoff`), the SimPy processes
(`processes`, the only module that imports simpy, and `pipeline`'s process for a
pipeline-parallel replica, which imports it when it runs; `closedloop`: what closed-loop
users share), what a run leaves (`results`, `metrics`, `plots`) and the Python API behind
`llmsim run` (`runner`), with the memory it needs
known first (`hostmem`).
"""
