"""The collector (HTTP ingestion and storage) and the offline analysis.

Importing this package is cheap; Flask, NumPy and SciPy load only with the
modules that need them.
"""
