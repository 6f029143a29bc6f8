"""The Veil client SDK: encode values privately on the device and upload reports."""

from veil.client.encoders import make_encoder

__all__ = ["make_encoder"]
