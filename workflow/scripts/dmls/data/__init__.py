"""Datasets, prepared once into a canonical cached form, and the loaders that feed the ranks."""
