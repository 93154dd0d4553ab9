"""Herald scheduler service (location-aware partitioning, on-demand sync plans).

Not built yet: issue #4 fills this package.
"""
