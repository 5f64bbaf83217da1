"""The simulation: a replica built from a scenario in one place (`build`, `memory`),
its state changes (`replica`, `moves`) beside its KV accounting (`kvaccount`), its record
(`recorder`; `steptally`: a step log kept as the summary's sums only) and its port to the fleet (`port`, `handoff`), the SimPy processes
(`processes`; `pipeline`'s process for a pipeline-parallel replica, which imports simpy
when it runs; `clock`, SimPy's clock: the only modules that import simpy; `feed`: a lone
replica's arrivals taken at its step ends; `closedloop`: what closed-loop users share; `split`, a feedback-free fleet simulated replica by replica, and `parallel`, its
replicas spread over processes), what a run leaves (`results`, `records`: requests as
columns on disk, `metrics`, `plots`; `bigstats`: exact figures of logs spilled to disk) and the
Python API behind `llmsim run` (`runner`), with the memory it needs known first (`hostmem`).
"""
