"""Many runs: sweeps (`sweep`), throughput-latency curves (`curve`), what one
replica sustains (`capacity`) in steady state (`steady`), fleets behind a router
(`fleet`) and `llmsim plan` (`planspec`, `candidates`, one candidate's estimate in
`estimate` with what bound it in `binding`, `plan`) with a 90 % interval on every
figure (`uncertainty`); the unit it sizes (`units`), pool keys over a cluster
(`poolkeys`), the arrival process (`traffic`), aggregated against disaggregated
(`deployments`), mixed GPU types behind a length router (`mixed`, `mixed_check`), sizing
for closed-loop users (`concurrency`); pool workers that end with the command (`lifetime`).
"""
