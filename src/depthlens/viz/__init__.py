"""Figures drawn from saved result records only (never from a model)."""
