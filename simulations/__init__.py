"""Synthetic populations, vectorized encoding, experiments and the demo."""
