"""The package version: a leaf module, so an up-to-date check can read it without importing anything else."""

__version__ = "0.1.0"
