"""The measurement engine: the machine (env), the measuring worker, one point's timing and peak (measure), sweeps and
their jobs, results and their files, what the points say (analysis), and the dashboard's one sweep at a time (stage)."""
