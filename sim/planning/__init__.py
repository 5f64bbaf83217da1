"""Many runs: sweeps (`sweep`), throughput-latency curves (`curve`), what one
replica sustains (`capacity`), fleets behind a router (`fleet`) and `llmsim plan`
(`planspec`, `candidates`, `plan`; the unit it sizes, `units`; pool keys over a
cluster, `poolkeys`; the arrival process, `traffic`; aggregated against
disaggregated, `deployments`; pool workers
that end with the command, `lifetime`).
"""
