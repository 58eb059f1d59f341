"""Studies over many runs: ``sweep`` (a scenario over a grid or random sample of field values)
and ``plan`` (the cheapest deployment that meets the SLOs)."""
