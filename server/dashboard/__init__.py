"""The dashboard: a read-only web app over a collector's store or a running collector.

``veil dashboard --db URL`` (or ``--server URL`` with a read token) serves it alone;
``veil serve --dashboard`` mounts it in the collector at ``/dashboard``. Pages: overview,
metric, joint metric, discovery, privacy, planner and operations, each with a JSON and a
CSV twin and its state in the URL (docs/dashboard.md).

The names below load on first use, so that the ``veil`` command lists this package's
subcommand without importing Flask or the analysis.
"""

from veil.server.lazy import lazy_getattr

_EXPORTS = {
    "create_dashboard": "veil.server.dashboard.app",
    "mount": "veil.server.dashboard.app",
    "MOUNT_PREFIX": "veil.server.dashboard.app",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
