"""The webhook's FastAPI app: ``POST /validate`` (AdmissionReview v1), health and metrics.

``/validate`` answers every body with HTTP 200 and an ``admission.k8s.io/v1``
AdmissionReview (:mod:`~dradriver.webhook.review`): a denial carries ``status.code`` 422,
``reason: Invalid`` and a message naming the fields, which kubectl prints as
``admission webhook "..." denied the request: <message>``. A body that is not a
well-formed AdmissionReview is denied with ``status.code`` 400, ``reason: BadRequest`` and a
message naming what is malformed. An internal error denies too (the same outcome as the
``failurePolicy: Fail`` the manifests use) and is logged with its traceback.

Hostile clients (the port is reachable by any pod, without authentication): a body over
``max_body_bytes`` gets a plain HTTP 413 before it is buffered
(:mod:`~dradriver.webhook.bodylimit`); validation runs off the event loop in bounded lanes
(:mod:`~dradriver.webhook.pool`), and a review its lane cannot take (full, or too slow) is
denied with ``status.code`` 429, ``reason: TooManyRequests``, and a message saying so.
The app's ``state.pool`` is the :class:`~dradriver.webhook.pool.ValidationPool`; whoever
serves the app closes it when done (:class:`~dradriver.webhook.server.WebhookServer` does).

Metrics labels take values from fixed sets only (anything else counts as ``other``):
the port may be reachable by anyone, and each new label value would be a time series kept
forever.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from fastapi import FastAPI, Request, Response

from dradriver.errors import FieldError
from dradriver.log import get_logger
from dradriver.metrics import CONTENT_TYPE, Counter, Histogram, Registry
from dradriver.webhook import review
from dradriver.webhook.bodylimit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from dradriver.webhook.pool import PoolLimits, Refused, ValidationPool
from dradriver.webhook.validation import KINDS, Settings, Verdict

log = get_logger("webhook")

OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
"""``request.operation`` values of admission.k8s.io/v1."""
OUTCOMES = ("allowed", "denied", "error", "malformed")
OTHER = "other"
TOO_MANY_REQUESTS = 429
ERROR_KIND = "error"  # the kind label of a review whose validation raised


def bounded(value: object, known: Collection[str]) -> str:
    """``value`` if it is one of ``known``, else ``other``: a label never takes a new value."""
    return value if isinstance(value, str) and value in known else OTHER


class WebhookMetrics:
    def __init__(self, registry: Registry) -> None:
        self.requests = Counter(
            "dradriver_webhook_requests",
            "AdmissionReviews answered, by kind validated ('other' if not ours, 'error' if "
            "validation failed), operation ('other' if not an admission operation) and "
            "outcome (allowed, denied, error, malformed).",
            ["kind", "operation", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "dradriver_webhook_request_duration_seconds",
            "Time to validate one AdmissionReview.",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
        )

    def count(self, kind: str, operation: object, outcome: str) -> None:
        self.requests.labels(
            bounded(kind, (*KINDS, ERROR_KIND)),
            bounded(operation, OPERATIONS),
            bounded(outcome, OUTCOMES),
        ).inc()


def _answer(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def _answer_verdict(uid: str, verdict: Verdict) -> Response:
    return _answer(review.encode(uid, verdict.allowed, review.INVALID, "Invalid", verdict.message))


def build_app(
    settings: Settings | None = None,
    registry: Registry | None = None,
    ready: Callable[[], tuple[bool, str]] | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    pool_limits: PoolLimits | None = None,
) -> FastAPI:
    """``ready()`` returns (ready?, reason); by default the webhook is ready while it serves."""
    settings = settings or Settings()
    registry = registry or Registry()
    metrics = WebhookMetrics(registry)
    app = FastAPI(title="dradriver-webhook", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    pool = ValidationPool(settings, pool_limits)
    app.state.pool = pool

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        ok, reason = ready() if ready is not None else (True, "serving")
        return Response(
            f"{'ok' if ok else 'not ready'}: {reason}\n",
            media_type="text/plain",
            status_code=200 if ok else 503,
        )

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(registry.exposition(), media_type=CONTENT_TYPE)

    @app.post("/validate")
    async def validate_endpoint(request: Request) -> Response:
        body = await request.body()
        decoded = review.decode(body)
        if isinstance(decoded, review.Malformed):
            metrics.count(OTHER, OTHER, "malformed")
            log.info("malformed review denied", uid=decoded.uid, reason=decoded.message)
            return _answer(review.deny_malformed(decoded))
        uid, admission = decoded.uid, decoded.request
        operation = admission["operation"]
        kind_ref = admission["kind"]
        meta = {
            "uid": uid,
            "operation": operation,
            "kind": kind_ref.get("kind"),
            "object": f"{admission.get('namespace') or ''}/{admission.get('name') or ''}".lstrip(
                "/"
            ),
            "user": (admission.get("userInfo") or {}).get("username"),
        }
        started = time.perf_counter()
        try:
            verdict = await pool.validate(admission, len(body))
        except Exception as e:  # never a 500: the apiserver would show a vaguer error
            log.exception("validation failed", **meta)
            metrics.count(ERROR_KIND, operation, "error")
            problem = FieldError("", f"internal error in the dradriver webhook: {e}")
            return _answer_verdict(uid, Verdict(False, (problem,)))
        finally:
            metrics.duration.observe(time.perf_counter() - started)
        if isinstance(verdict, Refused):
            log.warning("review not validated", **meta, reason=verdict.message)
            metrics.count(ERROR_KIND, operation, "error")
            return _answer(
                review.encode(uid, False, TOO_MANY_REQUESTS, "TooManyRequests", verdict.message)
            )
        outcome = "allowed" if verdict.allowed else "denied"
        metrics.count(verdict.kind or OTHER, operation, outcome)
        if verdict.allowed:
            log.debug("admitted", **meta)
        else:
            log.info("denied", **meta, reason=verdict.message)
        return _answer_verdict(uid, verdict)

    return app
