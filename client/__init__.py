"""The Veil client SDK: encode values privately on the device and upload reports.

::

    from veil.client import Client

    client = Client("https://veil.example.org", state_dir="/var/lib/myapp/veil")
    client.report("homepage", "example.com")
    client.flush()
"""

from veil.client.accounting import PrivacySpent
from veil.client.client import Client, FlushResult
from veil.client.encoders import make_encoder
from veil.client.errors import (
    BudgetExceededError,
    ClientClosedError,
    RegistryUnavailableError,
    StateError,
    UnknownMetricError,
)
from veil.client.transport import RequestsTransport, Transport
from veil.shared.errors import ParameterError, VeilError, WireFormatError

__all__ = [
    "BudgetExceededError",
    "Client",
    "ClientClosedError",
    "FlushResult",
    "ParameterError",
    "PrivacySpent",
    "RegistryUnavailableError",
    "RequestsTransport",
    "StateError",
    "Transport",
    "UnknownMetricError",
    "VeilError",
    "WireFormatError",
    "make_encoder",
]
