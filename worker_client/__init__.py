"""Worker clients: CuPy/NumPy embedding caches with HET clocks, plan execution.

Not built yet: issue #5 fills this package.
"""
