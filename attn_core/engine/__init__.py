"""The measurement engine: the machine (env), one measurement's problem (problem) and its result (measurement), one
point measured (measure, timing) in the worker process (worker), sweeps as data (config) run as a Job (job) on the
server's queue (stage), run files (results), and what the points say (analysis)."""
