"""Typed input and safe output: YAML into frozen dataclass specs with one-line errors
(`specload`), values remembered while their files are unchanged (`filecache`), measured
tables and grids (`tables`), numpy column tables as CSV/Parquet (`tablefile`), and output
folders written atomically that never touch what llmsim did not write (`outputs`,
`outdir`, `outfile`), their manifests read without trust (`manifest`) and the temp
folders of killed runs cleaned (`tempdirs`); a run's step log spilled to disk and read
back by slices (`spill`). Imports nothing of sim.
"""
