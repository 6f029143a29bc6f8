"""The server side of Veil, one subpackage per product.

``veil.server.collector`` (the HTTP app and its commands), ``veil.server.storage``
(the backends), ``veil.server.analysis`` (decoders and reports) and
``veil.server.cli`` (the ``veil`` command). Importing this package is cheap.
"""
