"""dradriver's validating admission webhook (FastAPI + uvicorn over TLS).

:mod:`~dradriver.webhook.validation` holds the checks (pure functions over
plain JSON objects), :mod:`~dradriver.webhook.app` the FastAPI app answering
``admission.k8s.io/v1`` AdmissionReviews on ``POST /validate``, and
:mod:`~dradriver.webhook.server` the ``dradriver-webhook`` command.
"""

from dradriver.webhook.validation import Verdict, validate

__all__ = ["Verdict", "validate"]
