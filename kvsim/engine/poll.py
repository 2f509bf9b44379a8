"""Fetch an engine's metrics over HTTP, poll them, and turn the scrapes into a Timeline.

Fetching is deliberately narrow, because the URL comes from a user and the answer from a
process we do not control:

- only ``http://`` and ``https://`` URLs (a redirect to another scheme is refused too);
  a URL without a path gets ``/metrics``, where vLLM and SGLang publish;
- no proxies from the environment: an engine is reached directly;
- a timeout on connecting and on every read, and a deadline for the whole response;
- a size limit: a response larger than ``max_bytes`` is cut off and refused;
- content checks: HTML, JSON, binary or non-UTF-8 answers are refused with a message that
  says what came back.

Every failure is a :class:`KvsimError` with one line fit to show an operator.

Polling takes a bounded number of scrapes at a fixed interval; the Timeline keeps gauges as
they are and turns counters into rates over each interval (``preemptions_per_s``,
``prefix_hit_rate``), since a cumulative count since start-up says little about now.
"""

from __future__ import annotations

import http.client
import math
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

import pandas as pd

from kvsim.engine.metrics import EngineSnapshot, parse_metrics
from kvsim.errors import KvsimError
from kvsim.timeline import make_timeline
from kvsim.units import MiB

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 8 * MiB  # a busy vLLM exposition is well under 1 MiB
MAX_SAMPLES = 10_000
START_HINT = "is the engine running? `vllm serve MODEL` exposes /metrics on port 8000"
_PATH_HINT = "vLLM and SGLang serve /metrics, trtllm-serve /prometheus/metrics, Triton :8002/metrics"
_CHUNK = 64 * 1024


def check_url(url: str) -> str:
    """The URL to fetch: http(s) only, with a host, ``/metrics`` when no path is given."""
    if not isinstance(url, str) or not url.strip():
        raise KvsimError("give the engine's metrics URL, e.g. http://localhost:8000/metrics")
    text = url.strip()
    if "://" not in text:
        raise KvsimError(f"URL {text!r} has no scheme; write http://{text}")
    try:
        parts = urlsplit(text)
        parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise KvsimError(f"malformed URL {text!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise KvsimError(f"only http:// and https:// URLs are supported, got {scheme}://")
    if not parts.hostname:
        raise KvsimError(f"URL {text!r} names no host")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects only to http(s) URLs (urllib would also follow ftp://)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        scheme = urlsplit(newurl).scheme.lower()
        if scheme not in ("http", "https"):
            raise KvsimError(f"{req.full_url} redirects to a {scheme}:// URL; only http and https are followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _HttpOnlyRedirects())


def _positive(label: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise KvsimError(f"{label} must be a positive number, got {value!r}")
    return float(value)


def fetch_text(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The body of ``url`` as text, within ``timeout_s`` and ``max_bytes``, or a KvsimError."""
    url = check_url(url)
    timeout_s = _positive("timeout", timeout_s)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise KvsimError(f"size limit must be a positive number of bytes, got {max_bytes!r}")
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={
        "Accept": "text/plain;version=0.0.4;q=1, */*;q=0.1",
        "Accept-Encoding": "identity",
        "User-Agent": "kvsim-engine-bridge",
    })
    try:
        with _OPENER.open(request, timeout=timeout_s) as resp:
            ctype = resp.headers.get("Content-Type", "") or ""
            if "html" in ctype.lower():
                raise KvsimError(f"{url} returned an HTML page, not Prometheus metrics; {_PATH_HINT}")
            length = resp.headers.get("Content-Length")
            if length and length.strip().isdigit() and int(length) > max_bytes:
                raise KvsimError(f"{url} announced {int(length):,} bytes, over the {max_bytes:,}-byte limit; "
                                 "is this a metrics endpoint?")
            chunks: list[bytes] = []
            total = 0
            while True:
                if time.monotonic() > deadline:
                    raise KvsimError(f"no complete response from {url} within {timeout_s:g} s")
                chunk = resp.read1(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > max_bytes:
                    raise KvsimError(f"response from {url} exceeds the {max_bytes:,}-byte limit; cut off. "
                                     "Is this a metrics endpoint?")
                chunks.append(chunk)
    except KvsimError:
        raise
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise KvsimError(f"{url} redirects to a URL that is not http(s); refused") from None
        hint = f" ({_PATH_HINT})" if exc.code == 404 else ""
        raise KvsimError(f"{url} answered HTTP {exc.code} {exc.reason}{hint}") from None
    except urllib.error.URLError as exc:
        raise KvsimError(_reason(url, exc.reason, timeout_s)) from None
    except (TimeoutError, socket.timeout):
        raise KvsimError(f"no complete response from {url} within {timeout_s:g} s") from None
    except http.client.HTTPException as exc:
        raise KvsimError(f"{url} closed the connection or did not answer in HTTP ({type(exc).__name__})") from None
    except (OSError, ValueError) as exc:
        raise KvsimError(_reason(url, exc, timeout_s)) from None
    return _decode(url, b"".join(chunks))


def _reason(url: str, reason: object, timeout_s: float) -> str:
    netloc = urlsplit(url).netloc
    if isinstance(reason, ConnectionRefusedError):
        return f"cannot connect to {netloc}: connection refused ({START_HINT})"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no response from {url} within {timeout_s:g} s"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve host {urlsplit(url).hostname!r}"
    if isinstance(reason, ssl.SSLError):
        return f"TLS error talking to {netloc}: {getattr(reason, 'reason', None) or reason}"
    if isinstance(reason, ConnectionError):
        return f"connection to {netloc} failed: {type(reason).__name__}"
    text = str(getattr(reason, "strerror", None) or reason).strip().splitlines()
    return f"cannot reach {url}: {text[0] if text else type(reason).__name__}"


def _decode(url: str, body: bytes) -> str:
    if b"\x00" in body:
        raise KvsimError(f"{url} returned binary data, not Prometheus metrics text")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise KvsimError(f"{url} returned text that is not UTF-8; not Prometheus metrics") from None
    head = text.lstrip()[:1]
    if head == "<":
        raise KvsimError(f"{url} returned HTML or XML, not Prometheus metrics; {_PATH_HINT}")
    if head in ("{", "["):
        raise KvsimError(f"{url} returned JSON, not Prometheus metrics text; {_PATH_HINT}")
    if not text.strip():
        raise KvsimError(f"{url} returned an empty body")
    return text


def scrape(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> EngineSnapshot:
    """Fetch and read one scrape of an engine."""
    return parse_metrics(fetch_text(url, timeout_s=timeout_s, max_bytes=max_bytes))


# ----- polling ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Scrape:
    """One snapshot and when it was taken."""

    time_s: float  # seconds since polling started (monotonic clock), when the answer arrived
    snapshot: EngineSnapshot


@dataclass(frozen=True)
class PollResult:
    """The scrapes taken, and why polling stopped early if it did."""

    url: str
    scrapes: list[Scrape]
    error: str | None = None  # a failure after the first scrape; earlier ones raise


def poll(
    url: str,
    *,
    samples: int = 1,
    interval_s: float = 1.0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
    on_scrape: Callable[[Scrape], None] | None = None,
    fetch: Callable[..., EngineSnapshot] = scrape,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> PollResult:
    """Scrape ``url`` ``samples`` times, ``interval_s`` apart (start to start).

    A failure on the first scrape raises; a later one ends polling and is kept in
    ``error`` with the scrapes taken so far, so an engine that goes away mid-poll still
    leaves its recent history.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= MAX_SAMPLES:
        raise KvsimError(f"samples must be a whole number from 1 to {MAX_SAMPLES:,}, got {samples!r}")
    if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not math.isfinite(interval_s) \
            or interval_s < 0:
        raise KvsimError(f"interval must be a non-negative number of seconds, got {interval_s!r}")
    url = check_url(url)
    _positive("timeout", timeout_s)
    t0 = clock()
    scrapes: list[Scrape] = []
    for i in range(samples):
        if i:
            wait = t0 + i * interval_s - clock()
            if wait > 0:
                sleep(wait)
        try:
            snap = fetch(url, timeout_s=timeout_s, max_bytes=max_bytes)
        except KvsimError as exc:
            if not scrapes:
                raise
            return PollResult(url, scrapes, str(exc))
        item = Scrape(clock() - t0, snap)
        scrapes.append(item)
        if on_scrape is not None:
            on_scrape(item)
    return PollResult(url, scrapes)


# ----- into a Timeline -------------------------------------------------------------------


def _nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def interval_rates(prev: Scrape | None, cur: Scrape) -> tuple[float, float]:
    """(preemptions per second, prefix hit rate) over the interval from ``prev`` to ``cur``.

    Counters that went down (an engine restart) give NaN for that interval. Where an engine
    publishes no prefix counters, its own hit-rate gauge is used as it stands.
    """
    a, b = (prev.snapshot if prev else None), cur.snapshot
    preempt_rate = float("nan")
    hit_rate = _nan(b.prefix_cache_hit_rate) if b.prefix_cache_queries is None else float("nan")
    if a is None:
        return preempt_rate, hit_rate
    dt = cur.time_s - prev.time_s
    if dt > 0 and a.num_preemptions is not None and b.num_preemptions is not None \
            and b.num_preemptions >= a.num_preemptions:
        preempt_rate = (b.num_preemptions - a.num_preemptions) / dt
    if None not in (a.prefix_cache_queries, b.prefix_cache_queries, a.prefix_cache_hits, b.prefix_cache_hits):
        dq = b.prefix_cache_queries - a.prefix_cache_queries
        dh = b.prefix_cache_hits - a.prefix_cache_hits
        if dq > 0 and 0 <= dh <= dq:
            hit_rate = dh / dq
    return preempt_rate, hit_rate


def scrapes_to_timeline(
    scrapes: list[Scrape],
    *,
    bytes_per_token: int | None = None,
    source: str = "measured",
) -> pd.DataFrame:
    """A measured Timeline: one row per scrape.

    With ``bytes_per_token`` (the model's KV bytes per token on one rank), the engine's
    used tokens and capacity become ``measured_kv_bytes`` and ``capacity_bytes``, per engine
    (the mean over engines when several share the endpoint), like every byte column.
    """
    rows = []
    prev: Scrape | None = None
    for step, item in enumerate(scrapes):
        snap = item.snapshot
        preempt_rate, hit_rate = interval_rates(prev, item)
        row = {
            "step": step,
            "time_s": float(item.time_s),
            "kv_usage_fraction": _nan(snap.kv_usage_fraction),
            "running": _nan(snap.num_running),
            "waiting": _nan(snap.num_waiting),
            "preemptions": _nan(snap.num_preemptions),
            "preemptions_per_s": preempt_rate,
            "prefix_hit_rate": hit_rate,
            "source": source,
        }
        if bytes_per_token:
            engines = max(1, len(snap.engine_ids))
            row["measured_kv_bytes"] = _nan(None if snap.kv_used_tokens is None
                                            else snap.kv_used_tokens * bytes_per_token / engines)
            row["capacity_bytes"] = _nan(None if snap.kv_capacity_tokens is None
                                         else snap.kv_capacity_tokens * bytes_per_token / engines)
        rows.append(row)
        prev = item
    if not rows:
        return make_timeline([])
    return make_timeline(rows)
