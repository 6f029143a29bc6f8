"""The dashboard's routes: every page as HTML, and as its JSON and CSV twins
(``?format=json``, ``?format=csv&table=NAME``), all behind a read token.

A browser signs in once with the token (the sign-in page keeps it in an HttpOnly,
SameSite=Strict cookie); scripts send ``Authorization: Bearer <token>``. Without one, a
page redirects to the sign-in page and a twin answers 401 JSON: no data either way. Every
answer carries a Content-Security-Policy of ``default-src 'self'``: the pages run only the
scripts served here, never inline ones, and load nothing from any other host.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    Response,
    current_app,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from jinja2 import Template
from werkzeug.wrappers import Response as BaseResponse

from veil.server.dashboard import admin_pages, joint_page, pages
from veil.server.dashboard import planner as planner_fields
from veil.server.dashboard.decodes import Decodes
from veil.server.dashboard.model import Page
from veil.server.dashboard.state import QUICK_RANGES, REFRESH, PageState
from veil.server.http import SourceError
from veil.server.storage.errors import StorageError
from veil.server.tokens import bearer_token, matching_token
from veil.shared.errors import ParameterError, VeilError
from veil.shared.privacy import format_epsilon

EXTENSION = "veil_dashboard"
COOKIE = "veil_dashboard_token"
CSP = ("default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")

#: page kinds drawn by another kind's template (the wheel must not hold two equal files)
SHARED_TEMPLATES = {"discovery": "metric"}

logger = logging.getLogger("veil.server.dashboard")

dashboard = Blueprint("dashboard", __name__, template_folder="templates",
                      static_folder="static", static_url_path="/static")


class Dashboard:
    """What the routes need, kept in ``app.extensions``: the decodes over the source and
    the read tokens that open the dashboard."""

    def __init__(self, decodes: Decodes, tokens: list[str]) -> None:
        self.decodes = decodes
        self.tokens = [token.encode("utf-8") for token in tokens]

    def accepts(self, given: str | None) -> bool:
        """Whether ``given`` is one of the read tokens (compared in constant time, every
        one of them)."""
        return bool(given) and matching_token(str(given), self.tokens) is not None


class PageError(Exception):
    """A request the dashboard refuses: ``status`` and a message naming the fix."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


@dashboard.app_template_filter("num")
def format_number(value: Any) -> str:
    """A value as a page shows it: whole numbers with thousands separators, other numbers
    to four significant digits, nothing as a dash (the twins keep full precision)."""
    if isinstance(value, float) and math.isinf(value):
        return "\u221e" if value > 0 else "-\u221e"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "\u2014"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and not 1e-3 <= abs(value) < 1e6:
            return f"{value:.3g}"
        return f"{value:.4g}"
    return str(value)


@dashboard.app_template_filter("eps")
def format_privacy(value: Any, label: Any = "") -> str:
    """A value shown where ``label`` (a column key, a fact's or a planner row's name) names
    an epsilon: rounded up to four significant digits, as every stated privacy cost is
    (:func:`~veil.shared.privacy.format_epsilon`), so a table never shows less than its
    statement; any other value as :func:`format_number` shows it."""
    name = str(label)
    if (isinstance(value, float) and math.isfinite(value) and value > 0
            and name.startswith(("epsilon", "\u03b5"))):
        return format_epsilon(value, 4)
    return format_number(value)


def current_dashboard() -> Dashboard:
    """The :class:`Dashboard` of the current app."""
    state: Dashboard = current_app.extensions[EXTENSION]
    return state


def _presented_token() -> str | None:
    return bearer_token(request.headers.get("Authorization")) or request.cookies.get(COOKIE)


def _wants_data() -> bool:
    return request.args.get("format") in ("json", "csv") or "Authorization" in request.headers


@dashboard.before_request
def require_token() -> BaseResponse | None:
    """No data without a read token: sign in first (pages) or 401 (twins, scripts)."""
    if request.endpoint in ("dashboard.signin", "dashboard.static"):
        return None
    if current_dashboard().accepts(_presented_token()):
        return None
    if _wants_data():
        answer = jsonify({"error": {"code": "unauthorized", "field": "Authorization",
                                    "message": "send a read token: 'Authorization: Bearer "
                                               "<token>', or sign in"}})
        answer.status_code = 401
        answer.headers["WWW-Authenticate"] = 'Bearer realm="veil"'
        return answer
    return redirect(url_for("dashboard.signin", next=request.full_path))


@dashboard.after_request
def security_headers(response: Response) -> Response:
    """CSP and friends on every answer; data pages are never cached by the browser."""
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    if request.endpoint != "dashboard.static":
        response.headers["Cache-Control"] = "no-store"
    return response


@dashboard.errorhandler(PageError)
def page_error(error: PageError) -> Response | tuple[str, int]:
    """A refused request as JSON (twins) or as a page saying what to fix."""
    if _wants_data():
        answer = jsonify({"error": {"code": "bad_request" if error.status == 400 else "not_found",
                                    "field": error.field, "message": error.message}})
        answer.status_code = error.status
        return answer
    return render_template("error.html", status=error.status, message=error.message,
                           title="Not found" if error.status == 404 else "Bad request",
                           state=None), error.status


@dashboard.errorhandler(SourceError)
@dashboard.errorhandler(StorageError)
def source_error(error: VeilError) -> Response | tuple[str, int]:
    """The source cannot be read (the collector is down or refuses the token, the store is
    missing or unavailable): 503, as JSON (twins) or as a page saying why, never a trace."""
    message = f"the dashboard cannot read its source: {error}"
    logger.warning("%s", message)
    if _wants_data():
        answer = jsonify({"error": {"code": "source_unavailable", "field": None,
                                    "message": message}})
        answer.status_code = 503
        return answer
    return render_template("error.html", status=503, message=message[0].upper() + message[1:],
                           title="Source unavailable", state=None), 503


def _state() -> PageState:
    try:
        return PageState.from_args(request.args)
    except ParameterError as exc:
        raise PageError(400, exc.message, exc.field) from None


def _metric_name(name: str) -> str:
    registry = current_dashboard().decodes.source.registry()
    if name not in registry:
        raise PageError(404, f"no metric {name!r}; the overview lists them all", "metric")
    return name


def _render(page: Page, state: PageState | None) -> Response | str:
    """``page`` as asked: HTML, or its JSON or CSV twin (``table`` picks the CSV's table)."""
    output = request.args.get("format") or "html"
    state_json: dict[str, Any] = {} if state is None else {
        "from": state.range_from, "to": state.range_to, "start": state.start, "end": state.end,
        "k": state.k, "refresh": state.refresh}
    if output == "json":
        return jsonify(page.to_json(state_json))
    if output == "csv":
        name = request.args.get("table") or (page.tables[0].name if page.tables else "")
        try:
            table = page.table(name)
        except KeyError:
            known = ", ".join(table.name for table in page.tables) or "none"
            raise PageError(400, f"table must name one of this page's tables ({known}); "
                                 f"got {name!r}", "table") from None
        answer = Response(table.to_csv(), mimetype="text/csv")
        answer.headers["Content-Disposition"] = f'inline; filename="{page.kind}-{table.name}.csv"'
        return answer
    charts = page.chart_data()
    query = state.query() if state is not None else ""
    links = {name: url_for("dashboard.metric", name=name) + (f"?{query}" if query else "")
             for name in current_dashboard().decodes.source.registry()}
    # a page kind without a template of its own is drawn by the one it shares (discovery:
    # the metric page's links), else by the plain page
    templates: list[str | Template] = [f"{page.kind}.html",
                                       f"{SHARED_TEMPLATES.get(page.kind, 'page')}.html"]
    return render_template(templates, page=page, state=state, charts=charts, links=links,
                           quick_ranges=QUICK_RANGES, refresh_choices=list(REFRESH),
                           fields=planner_fields.FIELDS, title=page.title)


def _page(build: Callable[[PageState], Page]) -> Response | str:
    state = _state()
    return _render(build(state), state)


@dashboard.get("/")
def overview() -> Response | str:
    """Every metric at a glance."""
    return _page(lambda state: pages.overview(current_dashboard().decodes, state))


@dashboard.get("/metric/<path:name>")
def metric(name: str) -> Response | str:
    """One metric's estimates and their course over the days."""
    name = _metric_name(name)
    return _page(lambda state: pages.metric_page(current_dashboard().decodes, name, state))


@dashboard.get("/joint/<path:name>")
def joint(name: str) -> Response | str:
    """A joint metric's table."""
    name = _metric_name(name)
    return _page(lambda state: joint_page.joint_page(current_dashboard().decodes, name, state))


@dashboard.get("/discovery/<path:name>")
def discovery(name: str) -> Response | str:
    """The strings a discovery channel found."""
    name = _metric_name(name)
    return _page(lambda state: pages.discovery_page(current_dashboard().decodes, name, state))


@dashboard.get("/privacy")
def privacy() -> Response | str:
    """Privacy costs per metric and in total."""
    return _page(lambda state: admin_pages.privacy_page(current_dashboard().decodes, state))


@dashboard.get("/planner")
def planner() -> Response | str:
    """Choose parameters: see their cost and precision before deploying them."""
    form = {key: value for key, value in request.args.items() if key != "format"}
    return _render(admin_pages.planner_page(form), None)


@dashboard.get("/operations")
def operations() -> Response | str:
    """Reports per day, refusals, store size and readiness."""
    return _page(lambda state: admin_pages.operations_page(current_dashboard().decodes, state))


@dashboard.route("/signin", methods=["GET", "POST"])
def signin() -> BaseResponse | tuple[str, int] | str:
    """The sign-in page: takes the read token and keeps it in an HttpOnly, SameSite=Strict
    cookie, then goes back to the page asked for."""
    target = _safe_next(request.values.get("next"))
    if request.method == "GET":
        return render_template("signin.html", next=target, error=None, state=None,
                               title="Sign in")
    token = (request.form.get("token") or "").strip()
    if not current_dashboard().accepts(token):
        return render_template("signin.html", next=target, state=None, title="Sign in",
                               error="That is not a read token of this dashboard."), 401
    answer = redirect(target)
    answer.set_cookie(COOKIE, token, httponly=True, samesite="Strict", secure=request.is_secure,
                      path=url_for("dashboard.overview"))
    return answer


@dashboard.post("/signout")
def signout() -> BaseResponse:
    """Forget the token (the cookie), back to the sign-in page."""
    answer = redirect(url_for("dashboard.signin"))
    answer.delete_cookie(COOKIE, path=url_for("dashboard.overview"))
    return answer


def _safe_next(target: str | None) -> str:
    """``target`` when it is a path of this dashboard, else the overview (no open
    redirect to another host)."""
    home = url_for("dashboard.overview")
    if not target:
        return home
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith(home) or target.startswith("//") \
            or not target.isprintable():
        return home  # a line end would make the Location header a second header
    return target
