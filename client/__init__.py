"""The Veil client SDK: encode values privately on the device and upload reports.

::

    from veil.client import Client

    client = Client("https://veil.example.org", app_name="myapp")
    client.report("homepage", "example.com")
    client.flush()

The client never blocks the application on the network and never raises into
it by default: what it cannot report it drops, counts (``client.drops``) and
logs once per cause on the ``veil.client`` logger. ``strict=True`` raises instead.
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
from veil.client.outage import Outage
from veil.client.transport import RequestsTransport, Transport
from veil.shared.errors import ParameterError, VeilError, WireFormatError

__all__ = [
    "BudgetExceededError",
    "Client",
    "ClientClosedError",
    "FlushResult",
    "Outage",
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
