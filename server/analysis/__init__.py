"""Offline analysis: decode frequencies and means with standard errors."""
