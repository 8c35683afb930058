"""The webhook's FastAPI app: ``POST /validate`` (AdmissionReview v1), health and metrics.

``/validate`` answers every well-formed ``admission.k8s.io/v1`` AdmissionReview
with HTTP 200 and ``response.allowed``; a denial carries ``status.code`` 422,
``reason: Invalid`` and a message naming the fields, which kubectl prints as
``admission webhook "..." denied the request: <message>``. A body that is not an
AdmissionReview gets HTTP 400. An internal error denies (the same outcome as the
``failurePolicy: Fail`` the manifests use) and is logged with its traceback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from dradriver.errors import FieldError
from dradriver.log import get_logger
from dradriver.webhook.validation import Settings, Verdict, validate

log = get_logger("webhook")

ADMISSION_API_VERSION = "admission.k8s.io/v1"
DENIED_CODE = 422


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "dradriver_webhook_requests",
            "AdmissionReviews answered, by kind validated ('other' if not ours), operation "
            "and outcome (allowed, denied, error).",
            ["kind", "operation", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "dradriver_webhook_request_duration_seconds",
            "Time to validate one AdmissionReview.",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
        )


def _review(uid: str, verdict: Verdict) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "code": DENIED_CODE,
            "reason": "Invalid",
            "message": verdict.message,
        }
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=400)


def build_app(
    settings: Settings | None = None,
    registry: CollectorRegistry | None = None,
    ready: Callable[[], tuple[bool, str]] | None = None,
) -> FastAPI:
    """``ready()`` returns (ready?, reason); by default the webhook is ready while it serves."""
    settings = settings or Settings()
    registry = registry or CollectorRegistry()
    metrics = WebhookMetrics(registry)
    app = FastAPI(title="dradriver-webhook", docs_url=None, redoc_url=None, openapi_url=None)

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
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/validate")
    async def validate_endpoint(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _bad_request("the body must be a JSON AdmissionReview")
        if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
            return _bad_request("the body must be an AdmissionReview")
        if body.get("apiVersion") != ADMISSION_API_VERSION:
            return _bad_request(
                f"apiVersion {body.get('apiVersion')!r} is not supported; "
                f"use {ADMISSION_API_VERSION!r} (admissionReviewVersions: [v1])"
            )
        review = body.get("request")
        if not isinstance(review, dict) or not isinstance(review.get("uid"), str):
            return _bad_request("request.uid is missing")
        operation = str(review.get("operation", ""))
        meta = {
            "uid": review["uid"],
            "operation": operation,
            "kind": (review.get("kind") or {}).get("kind"),
            "object": f"{review.get('namespace') or ''}/{review.get('name') or ''}".lstrip("/"),
            "user": (review.get("userInfo") or {}).get("username"),
        }
        started = time.perf_counter()
        try:
            verdict = validate(settings, review)
        except Exception as e:  # never a 500: the apiserver would show a vaguer error
            log.exception("validation failed", **meta)
            metrics.requests.labels("error", operation, "error").inc()
            problem = FieldError("", f"internal error in the dradriver webhook: {e}")
            verdict = Verdict(False, (problem,))
            return JSONResponse(_review(review["uid"], verdict))
        finally:
            metrics.duration.observe(time.perf_counter() - started)
        outcome = "allowed" if verdict.allowed else "denied"
        metrics.requests.labels(verdict.kind or "other", operation, outcome).inc()
        if verdict.allowed:
            log.debug("admitted", **meta)
        else:
            log.info("denied", **meta, reason=verdict.message)
        return JSONResponse(_review(review["uid"], verdict))

    return app
