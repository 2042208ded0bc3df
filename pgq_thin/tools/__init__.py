"""pgq's development tools: the demo, the benchmark, the chaos soak and the acceptance lab."""
