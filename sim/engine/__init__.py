"""The simulation: a replica built from a scenario in one place (`build`, `memory`),
its state changes (`replica`, `handoff`), the SimPy processes (`processes`, the only
module that imports simpy), what a run leaves (`results`, `metrics`, `plots`) and the
Python API behind `llmsim run` (`runner`), with the memory it needs known first (`hostmem`).
"""
