"""Fetching and polling against a real HTTP server on loopback, bad input of every kind, and
the `kvsim engine` command end to end."""

from __future__ import annotations

import io
import json
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from http.server import BaseHTTPRequestHandler

import pandas as pd
import pytest

from kvsim.cli import main
from kvsim.engine import check_url, fetch_text, poll, scrape, scrapes_to_timeline
from kvsim.engine.poll import Scrape
from kvsim.errors import KvsimError
from kvsim.timeline import validate_timeline

from tests.kvsim.engine_texts import SGLANG, TRITON, TRTLLM, VLLM_V0, vllm_v1
from tests.loopback import closed_port, serve

ROUTES = {
    "/metrics": vllm_v1(),
    "/v0/metrics": VLLM_V0,
    "/sglang/metrics": SGLANG,
    "/prometheus/metrics": TRTLLM,
    "/triton/metrics": TRITON,
}


class _Handler(BaseHTTPRequestHandler):
    counter = 0
    flaky_hits = 0
    lock = threading.Lock()

    def _send(self, body: bytes, ctype="text/plain; version=0.0.4; charset=utf-8", status=200, length=True):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        path = self.path
        if path in ROUTES:
            return self._send(ROUTES[path].encode())
        if path == "/html":
            return self._send(b"<html><body>Not here</body></html>", ctype="text/html")
        if path == "/html-as-text":
            return self._send(b"<!DOCTYPE html>\n<html></html>")
        if path == "/json":
            return self._send(b'{"detail": "Not Found"}', ctype="application/json")
        if path == "/garbage":
            return self._send(b"hello world\nthis is not metrics\n")
        if path == "/binary":
            return self._send(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
        if path == "/latin1":
            return self._send("vllm:x 1 # caf\u00e9".encode("latin-1"))
        if path == "/500":
            return self._send(b"boom", status=500)
        if path == "/slow":
            time.sleep(1.5)
            return self._send(ROUTES["/metrics"].encode())
        if path == "/drip":  # headers at once, then one byte every 0.3 s, forever
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(0.3)
            except OSError:
                pass
            return None
        if path == "/huge":  # streams without Content-Length far past any sane limit
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            line = b"# padding " + b"x" * 1014 + b"\n"
            try:
                for _ in range(64 * 1024):  # up to 64 MiB
                    self.wfile.write(line)
            except OSError:
                pass
            return None
        if path == "/huge-announced":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(10**10))
            self.end_headers()
            return None
        if path == "/redirect-file":
            self.send_response(302)
            self.send_header("Location", "file:///etc/passwd")
            self.end_headers()
            return None
        if path == "/redirect-ftp":
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1/metrics")
            self.end_headers()
            return None
        if path == "/redirect-ok":
            self.send_response(302)
            self.send_header("Location", "/sglang/metrics")
            self.end_headers()
            return None
        if path == "/counting":  # counters advance by fixed steps on every scrape
            with _Handler.lock:
                _Handler.counter += 1
                n = _Handler.counter
            body = vllm_v1(engines=(("0", n, 0, 0.5, 1000, 2 * n, 100 * n, 40 * n),))
            return self._send(body.encode())
        if path == "/flaky":  # three good scrapes, then errors
            with _Handler.lock:
                _Handler.flaky_hits += 1
                n = _Handler.flaky_hits
            if n <= 3:
                return self._send(ROUTES["/metrics"].encode())
            return self._send(b"down", status=503)
        return self._send(b"not found", status=404)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def base():
    with serve(_Handler) as url:
        yield url


# ----- each engine over HTTP --------------------------------------------------------------


@pytest.mark.parametrize("path, engine, usage, running", [
    ("/metrics", "vllm", 0.375, 8),
    ("/v0/metrics", "vllm", 0.42, 3),
    ("/sglang/metrics", "sglang", 0.3, 12),
    ("/prometheus/metrics", "trtllm", 0.5, 4),
    ("/triton/metrics", "triton-trtllm", 0.1, 3),
])
def test_scrape_each_engine(base, path, engine, usage, running):
    snap = scrape(base + path, timeout_s=5)
    assert snap.engine == engine
    assert snap.kv_usage_fraction == pytest.approx(usage)
    assert snap.num_running == running


def test_url_without_path_gets_metrics(base):
    assert check_url(base) == base + "/metrics"
    assert check_url(base + "/") == base + "/metrics"
    assert scrape(base).engine == "vllm"


# ----- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("url, needle", [
    ("file:///etc/passwd", "only http:// and https://"),
    ("ftp://127.0.0.1/metrics", "only http:// and https://"),
    ("gopher://127.0.0.1:70/", "only http:// and https://"),
    ("localhost:8000/metrics", "no scheme"),
    ("http:///metrics", "names no host"),
    ("http://127.0.0.1:99999/metrics", "malformed URL"),
    ("", "give the engine's metrics URL"),
])
def test_refused_urls(url, needle):
    with pytest.raises(KvsimError, match=needle):
        fetch_text(url)


def test_connection_refused_is_quick_and_says_what_to_start():
    start = time.monotonic()
    with pytest.raises(KvsimError, match="connection refused.*vllm serve MODEL"):
        fetch_text(f"http://127.0.0.1:{closed_port()}/metrics", timeout_s=2)
    assert time.monotonic() - start < 2


def test_timeout_on_a_slow_server(base):
    start = time.monotonic()
    with pytest.raises(KvsimError, match="within 0.5 s"):
        fetch_text(base + "/slow", timeout_s=0.5)
    assert time.monotonic() - start < 1.4


def test_a_trickling_response_hits_the_deadline(base):
    start = time.monotonic()
    with pytest.raises(KvsimError, match="no complete response .* within 1 s"):
        fetch_text(base + "/drip", timeout_s=1.0)
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("path, needle", [
    ("/500", "HTTP 500"),
    ("/nowhere", "HTTP 404.*trtllm-serve /prometheus/metrics"),
    ("/html", "HTML page"),
    ("/html-as-text", "HTML or XML"),
    ("/json", "JSON"),
    ("/binary", "binary data"),
    ("/latin1", "not UTF-8"),
    ("/redirect-file", "redirects to a URL that is not http"),
    ("/redirect-ftp", "redirects to a ftp:// URL"),
])
def test_bad_answers(base, path, needle):
    with pytest.raises(KvsimError, match=needle):
        fetch_text(base + path, timeout_s=3)


def test_garbage_is_not_metrics(base):
    with pytest.raises(KvsimError, match="not Prometheus metrics text"):
        scrape(base + "/garbage", timeout_s=3)


def test_enormous_response_is_cut_off(base):
    start = time.monotonic()
    with pytest.raises(KvsimError, match="exceeds the 1,048,576-byte limit"):
        fetch_text(base + "/huge", timeout_s=5, max_bytes=1 << 20)
    assert time.monotonic() - start < 3


def test_announced_enormous_response_is_refused_before_reading(base):
    with pytest.raises(KvsimError, match="announced 10,000,000,000 bytes"):
        fetch_text(base + "/huge-announced", timeout_s=3)


def test_http_redirect_is_followed(base):
    assert scrape(base + "/redirect-ok", timeout_s=3).engine == "sglang"


def test_every_error_is_one_line(base):
    for url in (base + "/html", base + "/500", f"http://127.0.0.1:{closed_port()}/", base + "/garbage"):
        with pytest.raises(KvsimError) as info:
            scrape(url, timeout_s=2)
        assert "\n" not in str(info.value)


# ----- polling -------------------------------------------------------------------------------


def test_poll_turns_counters_into_rates(base):
    result = poll(base + "/counting", samples=4, interval_s=0.05, timeout_s=3)
    assert result.error is None and len(result.scrapes) == 4
    tl = scrapes_to_timeline(result.scrapes, bytes_per_token=1000)
    validate_timeline(tl)
    times = tl["time_s"].tolist()
    assert all(b > a for a, b in zip(times, times[1:]))
    assert pd.isna(tl["preemptions_per_s"].iloc[0]) and pd.isna(tl["prefix_hit_rate"].iloc[0])
    for i in range(1, 4):  # the server adds 2 preemptions, 100 queries and 40 hits per scrape
        assert tl["preemptions_per_s"].iloc[i] == pytest.approx(2 / (times[i] - times[i - 1]))
        assert tl["prefix_hit_rate"].iloc[i] == pytest.approx(0.4)
    # 0.5 x 1000 blocks x 16 tokens x 1000 bytes
    assert (tl["measured_kv_bytes"] == 0.5 * 1000 * 16 * 1000).all()
    assert (tl["capacity_bytes"] == 1000 * 16 * 1000).all()


def test_poll_keeps_what_it_had_when_the_engine_goes_away(base):
    _Handler.flaky_hits = 0
    result = poll(base + "/flaky", samples=6, interval_s=0.01, timeout_s=3)
    assert len(result.scrapes) == 3 and "HTTP 503" in result.error


def test_poll_first_failure_raises():
    with pytest.raises(KvsimError, match="connection refused"):
        poll(f"http://127.0.0.1:{closed_port()}/metrics", samples=3, interval_s=0.01, timeout_s=1)


def test_poll_schedules_scrapes_interval_apart():
    now = [100.0]
    waits = []

    def fake_fetch(url, **kw):
        now[0] += 0.25  # each scrape takes 0.25 s
        return scrape_snapshot

    def fake_sleep(s):
        waits.append(s)
        now[0] += s

    from kvsim.engine import parse_metrics
    scrape_snapshot = parse_metrics(vllm_v1())
    result = poll("http://x/metrics", samples=4, interval_s=1.0, fetch=fake_fetch, clock=lambda: now[0],
                  sleep=fake_sleep)
    assert waits == pytest.approx([0.75, 0.75, 0.75])
    assert [s.time_s for s in result.scrapes] == pytest.approx([0.25, 1.25, 2.25, 3.25])


@pytest.mark.parametrize("kwargs, needle", [
    ({"samples": 0}, "samples"), ({"samples": 10_001}, "samples"), ({"interval_s": -1}, "interval"),
    ({"timeout_s": 0}, "timeout"),
])
def test_poll_bounds(kwargs, needle):
    with pytest.raises(KvsimError, match=needle):
        poll("http://127.0.0.1:1/metrics", **kwargs)


def test_counter_reset_gives_no_rate():
    from kvsim.engine import parse_metrics
    a = Scrape(0.0, parse_metrics(vllm_v1(engines=(("0", 1, 0, 0.1, 10, 50, 1000, 500),))))
    b = Scrape(1.0, parse_metrics(vllm_v1(engines=(("0", 1, 0, 0.1, 10, 3, 10, 5),))))
    tl = scrapes_to_timeline([a, b])
    assert pd.isna(tl["preemptions_per_s"].iloc[1]) and pd.isna(tl["prefix_hit_rate"].iloc[1])


# ----- the CLI -------------------------------------------------------------------------------


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


REQUIRED_KEYS = {"engine", "kv_usage_fraction", "num_running", "num_waiting", "num_preemptions", "block_size",
                 "num_gpu_blocks", "prefix_cache_hit_rate"}


def test_cli_url_json_vllm(base):
    code, out, _ = _cli("engine", "--url", base + "/metrics", "--json")
    assert code == 0
    data = json.loads(out)
    assert REQUIRED_KEYS <= set(data)
    assert data["engine"] == "vllm" and data["num_running"] == 8 and data["num_gpu_blocks"] == 4000
    assert data["block_size"] == 16 and data["prefix_cache_hit_rate"] == pytest.approx(1750 / 4000)
    assert len(data["per_engine"]) == 2 and data["error"] is None


def test_cli_json_is_null_where_the_engine_does_not_say(base):
    code, out, _ = _cli("engine", "--url", base + "/sglang/metrics", "--json")
    data = json.loads(out)
    assert code == 0 and data["engine"] == "sglang"
    assert data["num_preemptions"] is None and data["block_size"] is None and data["num_gpu_blocks"] is None
    assert "NaN" not in out


def test_cli_samples_model_and_gpu(base):
    code, out, _ = _cli("engine", "--url", base + "/counting", "--samples", "3", "--interval", "0.05",
                        "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--json")
    data = json.loads(out)
    assert code == 0 and data["num_samples"] == 3 and len(data["samples"]) == 3
    assert data["bytes_per_token"] == 131072  # 2 x 32 layers x 8 heads x 128 x 2 bytes
    assert data["measured_kv_bytes"] == 0.5 * 1000 * 16 * 131072
    pred = data["prediction"]
    assert pred["engine_num_blocks"] == 1000
    assert pred["ratio_engine_to_planner"] == pytest.approx(1000 / pred["num_blocks"])
    assert data["prefix_cache_hit_rate_window"] == pytest.approx(0.4)


@pytest.mark.parametrize("url, needle", [
    ("ftp://127.0.0.1/metrics", "only http:// and https://"),
    ("http://127.0.0.1:{port}/metrics", "connection refused"),
    ("{base}/html", "HTML page"),
])
def test_cli_errors_are_one_line_exit_2(base, url, needle):
    code, out, err = _cli("engine", "--url", url.format(port=closed_port(), base=base), "--timeout", "2")
    assert code == 2 and out == ""
    assert err.startswith("kvsim: error: ") and needle in err and err.count("\n") == 1


def test_cli_log(tmp_path):
    path = tmp_path / "vllm.log"
    path.write_text("INFO x] GPU KV cache size: 34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x\n")
    code, out, _ = _cli("engine", "--log", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["kv_cache_tokens"] == 34_952 and data["max_concurrency"] == 4.27
    assert "comparison" not in data
    code, out, _ = _cli("engine", "--log", str(path), "--model", "llama-3.1-8b", "--gpu", "l4", "--json")
    data = json.loads(out)
    rows = {r["quantity"]: r for r in data["comparison"]}
    assert rows["KV cache tokens"]["planner"] == data["plan"]["kv_tokens"]
    assert rows["KV cache tokens"]["ratio"] == pytest.approx(34_952 / data["plan"]["kv_tokens"])
    assert data["plan"]["max_len"] == 8_192


def test_cli_log_errors(tmp_path):
    code, _, err = _cli("engine", "--log", str(tmp_path / "missing.log"))
    assert code == 2 and "cannot read" in err
    empty = tmp_path / "empty.log"
    empty.write_text("nothing\n")
    code, _, err = _cli("engine", "--log", str(empty))
    assert code == 2 and "no KV capacity lines" in err
    code, _, err = _cli("engine", "--log", str(empty), "--model", "llama-3.1-8b")
    assert code == 2
