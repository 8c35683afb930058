"""The webhook's limits against hostile clients, as one value and as command-line flags.

Invariants:

* :class:`WebhookLimits` holds every limit the webhook enforces: the request body
  (:mod:`~dradriver.webhook.bodylimit`), the CEL selectors compiled per review
  (:class:`~dradriver.webhook.validation.Settings`) and the validation lanes
  (:class:`~dradriver.webhook.pool.PoolLimits`); its defaults are the modules' defaults.
* :func:`add_flags` adds one flag per limit, with a prefix (``dradriver-webhook``: none;
  ``dradriver-controller``: ``webhook-``), and :func:`from_args` reads them back; a value
  out of range is a ``ValueError`` naming the flag and the allowed range, never a limit
  that silently does something else (a review timeout at or over the apiserver's longest
  webhook timeout, a small-body lane that would take every body).
* Nothing here imports the web framework: the controller parses these flags even when it
  serves no webhook.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from typing import Any

from dradriver.webhook.pool import PoolLimits
from dradriver.webhook.validation import DEFAULT_MAX_SELECTOR_BYTES, DEFAULT_MAX_SELECTORS, Settings

__all__ = ["DEFAULT_MAX_BODY_BYTES", "WebhookLimits", "add_flags", "from_args"]

DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024
MIN_BODY_BYTES = 64 * 1024
"""Below this even an ordinary claim's review (object and old object) may not fit."""
APISERVER_MAX_TIMEOUT = 30.0
"""The longest ``timeoutSeconds`` a webhook registration may have; a review must be
answered before the apiserver gives up, so the review timeout stays under it."""


@dataclass(frozen=True)
class WebhookLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_selectors: int = DEFAULT_MAX_SELECTORS
    max_selector_bytes: int = DEFAULT_MAX_SELECTOR_BYTES
    pool: PoolLimits = field(default_factory=PoolLimits)

    def settings(self, settings: Settings) -> Settings:
        """``settings`` with this selector budget."""
        return replace(
            settings, max_selectors=self.max_selectors, max_selector_bytes=self.max_selector_bytes
        )


@dataclass(frozen=True)
class _Flag:
    name: str  # without the prefix
    field: str  # WebhookLimits field, or pool.<PoolLimits field>
    kind: type[int] | type[float]
    minimum: float
    help: str


_FLAGS = (
    _Flag(
        "max-body-bytes",
        "max_body_bytes",
        int,
        MIN_BODY_BYTES,
        "request bodies larger than this get HTTP 413 before they are read; an "
        "AdmissionReview of the largest object the apiserver stores (1.5 MiB, twice for an "
        "update) fits the default",
    ),
    _Flag("max-selectors", "max_selectors", int, 1, "CEL selectors compiled per review"),
    _Flag("max-selector-bytes", "max_selector_bytes", int, 1, "CEL text compiled per review"),
    _Flag(
        "small-body-bytes",
        "pool.small_body_bytes",
        int,
        1,
        "reviews up to this size are validated in threads (the small lane), larger ones in "
        "child processes (the large lane); must be below the body limit",
    ),
    _Flag("small-workers", "pool.small_workers", int, 1, "threads of the small lane"),
    _Flag(
        "small-queue",
        "pool.small_queue",
        int,
        0,
        "small reviews waiting for a thread; one more gets a 429 denial at once",
    ),
    _Flag("large-workers", "pool.large_workers", int, 1, "child processes of the large lane"),
    _Flag(
        "large-queue",
        "pool.large_queue",
        int,
        0,
        "large reviews waiting for a child; one more gets a 429 denial at once",
    ),
    _Flag(
        "review-timeout",
        "pool.timeout",
        float,
        0,
        "seconds a review may take to validate before it is denied with 429; keep it "
        "under the registration's timeoutSeconds (10 in the chart)",
    ),
)


def _default(flag: _Flag) -> Any:
    if flag.field.startswith("pool."):
        return getattr(PoolLimits(), flag.field.removeprefix("pool."))
    return {f.name: f.default for f in fields(WebhookLimits) if f.name == flag.field}[flag.field]


def _dest(prefix: str, flag: _Flag) -> str:
    return (prefix + flag.name).replace("-", "_")


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, prefix: str = "") -> None:
    """One flag per limit, ``--<prefix><name>``; :func:`from_args` checks the values."""
    for flag in _FLAGS:
        parser.add_argument(
            f"--{prefix}{flag.name}",
            type=flag.kind,
            default=_default(flag),
            dest=_dest(prefix, flag),
            metavar="SECONDS" if flag.kind is float else "N",
            help=f"{flag.help} (default: %(default)s)",
        )


def from_args(args: argparse.Namespace, prefix: str = "") -> WebhookLimits:
    """The limits the flags give; ValueError names the flag of a value out of range."""
    top: dict[str, Any] = {}
    pool: dict[str, Any] = {}
    for flag in _FLAGS:
        value = getattr(args, _dest(prefix, flag))
        name = f"--{prefix}{flag.name}"
        if flag.kind is float and not flag.minimum < value < APISERVER_MAX_TIMEOUT:
            raise ValueError(
                f"{name}: {value:g} is out of range; give seconds above 0 and below "
                f"{APISERVER_MAX_TIMEOUT:g} (the apiserver waits at most that long)"
            )
        if flag.kind is int and value < flag.minimum:
            raise ValueError(f"{name}: {value} is out of range; give at least {flag.minimum:g}")
        if flag.field.startswith("pool."):
            pool[flag.field.removeprefix("pool.")] = value
        else:
            top[flag.field] = value
    limits = WebhookLimits(**top, pool=PoolLimits(**pool))
    if limits.pool.small_body_bytes >= limits.max_body_bytes:
        raise ValueError(
            f"--{prefix}small-body-bytes: {limits.pool.small_body_bytes} is not below "
            f"--{prefix}max-body-bytes ({limits.max_body_bytes}); the large lane would "
            "never be used"
        )
    return limits
