"""heraldps: a parameter-server cluster for embedding models."""

__version__ = "0.1.0"
