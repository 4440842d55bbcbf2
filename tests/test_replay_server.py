"""The loopback replay server over real sockets: framing, scripted chunking/drip/cuts,
error statuses, request recording, script exhaustion, and survival of bad clients."""

from __future__ import annotations

import subprocess
import sys

import anyio
import httpx
import pytest

from callgate.engine.core.errors import ConfigError
from callgate.engine.runtime.replay import (
    EXHAUSTED_STATUS,
    ReplayScript,
    ReplayServer,
    ReplayTurn,
)

from .conftest import FIXTURES

FIXTURE = FIXTURES / "openai_chat" / "parallel_tool_calls_two_functions.sse"
BODY = FIXTURE.read_bytes()


async def _raw_exchange(base_url: str, request: bytes) -> bytes:
    """Send raw request bytes, read until the server closes; returns the whole response."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        await stream.send(request)
        data = bytearray()
        try:
            while True:
                data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
    return bytes(data)


def _parse_chunked(raw: bytes) -> tuple[bytes, list[bytes], bool]:
    """(head, data chunks, saw the terminating chunk) of a chunked HTTP/1.1 response."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    chunks: list[bytes] = []
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return head, chunks, rest == b"\r\n"
        chunks.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]
    return head, chunks, False


GET = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.mark.anyio
async def test_fixture_served_in_one_byte_chunks_arrives_intact() -> None:
    async with ReplayServer([ReplayTurn(body=BODY, chunk_size=1)]) as server:
        raw = await _raw_exchange(server.base_url, GET)
    head, chunks, terminated = _parse_chunked(raw)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"transfer-encoding: chunked" in head
    assert b"content-type: text/event-stream" in head
    assert terminated
    assert len(chunks) == len(BODY)
    assert all(len(c) == 1 for c in chunks)
    assert b"".join(chunks) == BODY
    assert server.completed == 1
    assert server.handler_errors == []


@pytest.mark.anyio
async def test_httpx_reads_whole_body_through_chunking() -> None:
    turns = [ReplayTurn(body=BODY, chunk_size=n) for n in (None, 1, 13)]
    async with ReplayServer(turns) as server, httpx.AsyncClient() as client:
        for _ in turns:
            response = await client.post(server.base_url + "/v1/chat/completions", json={})
            assert response.status_code == 200
            assert response.content == BODY


@pytest.mark.anyio
async def test_slow_drip_writes_each_chunk_after_the_delay() -> None:
    delay = 0.03
    size = len(BODY) // 4 + 1
    async with ReplayServer([ReplayTurn(body=BODY, chunk_size=size, delay_s=delay)]) as server:
        started = anyio.current_time()
        raw = await _raw_exchange(server.base_url, GET)
        elapsed = anyio.current_time() - started
    _, chunks, terminated = _parse_chunked(raw)
    assert terminated
    assert [len(c) for c in chunks] == [size, size, size, len(BODY) - 3 * size]
    assert b"".join(chunks) == BODY
    # Three waits between four chunks: the response cannot finish sooner.
    assert elapsed >= 3 * delay


@pytest.mark.anyio
async def test_disconnect_after_n_bytes_is_an_error_for_the_client() -> None:
    cut = 100
    turn = ReplayTurn(body=BODY, chunk_size=30, disconnect_after=cut)
    async with ReplayServer([turn]) as server, httpx.AsyncClient() as client:
        received = bytearray()
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("POST", server.base_url + "/s", json={}) as r:
                async for piece in r.aiter_raw():
                    received += piece
        await server.wait_for_dropped(1)
    assert bytes(received) == BODY[:cut]
    assert server.completed == 0
    assert server.handler_errors == []


@pytest.mark.anyio
async def test_disconnect_leaves_out_the_terminating_chunk() -> None:
    async with ReplayServer([ReplayTurn(body=BODY, disconnect_after=len(BODY))]) as server:
        raw = await _raw_exchange(server.base_url, GET)
    _, chunks, terminated = _parse_chunked(raw)
    assert b"".join(chunks) == BODY
    assert not terminated


@pytest.mark.anyio
async def test_error_status_with_retry_after_and_json_body() -> None:
    turns = [
        ReplayTurn.json_error(
            429, {"error": {"code": "rate_limited"}}, headers={"retry-after": "3"}
        ),
        ReplayTurn.json_error(529),
    ]
    async with ReplayServer(turns) as server, httpx.AsyncClient() as client:
        first = await client.post(server.base_url + "/v1/messages", json={})
        second = await client.post(server.base_url + "/v1/messages", json={})
    assert first.status_code == 429
    assert first.headers["retry-after"] == "3"
    assert first.headers["content-type"] == "application/json"
    assert first.json() == {"error": {"code": "rate_limited"}}
    assert second.status_code == 529
    assert second.reason_phrase == "Overloaded"
    assert second.json()["error"]["code"] == 529


@pytest.mark.anyio
async def test_requests_are_recorded_with_json_bodies() -> None:
    payload = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "stream": True}
    async with ReplayServer([ReplayTurn(body=BODY)]) as server, httpx.AsyncClient() as client:
        await client.post(
            server.base_url + "/v1beta/models/g:streamGenerateContent?alt=sse&x=1",
            json=payload,
            headers={"X-Api-Key": "k-123", "X-Multi": "a"},
        )
        await server.wait_for_requests(1)
    (request,) = server.requests
    assert request.method == "POST"
    assert request.path == "/v1beta/models/g:streamGenerateContent"
    assert request.query == "alt=sse&x=1"
    assert request.query_params() == {"alt": ["sse"], "x": ["1"]}
    assert request.headers["x-api-key"] == "k-123"
    assert request.headers["content-type"] == "application/json"
    assert all(k == k.lower() for k in request.headers)
    assert request.json() == payload


@pytest.mark.anyio
async def test_script_exhaustion_answers_599_with_json_error() -> None:
    async with ReplayServer([ReplayTurn(body=BODY)]) as server, httpx.AsyncClient() as client:
        ok = await client.post(server.base_url + "/a", json={})
        over = await client.post(server.base_url + "/a", json={})
    assert ok.status_code == 200
    assert over.status_code == EXHAUSTED_STATUS
    assert over.json()["error"]["code"] == "replay_script_exhausted"
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_scripts_keyed_by_path_advance_independently() -> None:
    script = ReplayScript(
        turns=(ReplayTurn(body=b"default"),),
        by_path={"/one": (ReplayTurn(body=b"one-1"), ReplayTurn(body=b"one-2"))},
    )
    async with ReplayServer(script) as server, httpx.AsyncClient() as client:
        bodies = [
            (await client.post(server.base_url + path, json={})).content
            for path in ("/one", "/other", "/one")
        ]
        exhausted = await client.post(server.base_url + "/one", json={})
    assert bodies == [b"one-1", b"default", b"one-2"]
    assert exhausted.status_code == EXHAUSTED_STATUS


@pytest.mark.anyio
async def test_client_hanging_up_mid_response_does_not_kill_the_server() -> None:
    turns = [ReplayTurn(body=BODY, chunk_size=1, delay_s=0.002), ReplayTurn(body=BODY)]
    async with ReplayServer(turns) as server:
        host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
        stream = await anyio.connect_tcp(host, int(port))
        await stream.send(GET)
        assert (await stream.receive()).startswith(b"HTTP/1.1 200")
        await stream.aclose()
        with anyio.fail_after(10):
            await server.wait_for_dropped(1)
        async with httpx.AsyncClient() as client:
            after = await client.get(server.base_url)
    assert after.status_code == 200
    assert after.content == BODY
    assert server.handler_errors == []


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NOT A REQUEST\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nbad header\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX : y\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
        (b"POST / HTTP/1.1\r\nContent-Length: 2000\r\n\r\n", 413),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n", 431),
    ],
    ids=lambda v: str(v) if isinstance(v, int) else v[:24].decode(errors="replace"),
)
@pytest.mark.anyio
async def test_malformed_requests_get_an_error_status_and_the_server_survives(
    request_bytes: bytes, status: int
) -> None:
    server = ReplayServer([ReplayTurn(body=b"ok")], max_head_bytes=4096, max_body_bytes=1000)
    async with server:
        raw = await _raw_exchange(server.base_url, request_bytes)
        async with httpx.AsyncClient() as client:
            after = await client.post(server.base_url, json={})
    assert raw.startswith(f"HTTP/1.1 {status} ".encode())
    assert after.content == b"ok"
    assert len(server.requests) == 1  # the malformed one was never recorded
    assert server.handler_errors == []


@pytest.mark.anyio
async def test_client_closing_before_a_full_request_is_dropped_quietly() -> None:
    async with ReplayServer([ReplayTurn(body=b"ok")]) as server:
        host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
            await stream.send_eof()
            with pytest.raises(anyio.EndOfStream):
                await stream.receive()  # no response to a request that never completed
        with anyio.fail_after(10):
            await server.wait_for_dropped(1)
    assert server.requests == []
    assert server.handler_errors == []


def test_run_in_thread_serves_sync_callers() -> None:
    with ReplayServer.run_in_thread([ReplayTurn(body=BODY, chunk_size=64)]) as server:
        with httpx.Client() as client:
            response = client.post(server.base_url + "/v1/x", json={"n": 1})
        assert response.content == BODY
        assert [r.json() for r in server.requests] == [{"n": 1}]
    with pytest.raises(ConfigError):
        _ = server.base_url  # stopped with the context


def test_run_in_thread_serves_another_process() -> None:
    code = (
        "import sys, httpx; r = httpx.post(sys.argv[1] + '/p', json={'from': 'child'});"
        "sys.stdout.buffer.write(r.content)"
    )
    with ReplayServer.run_in_thread([ReplayTurn(body=BODY)], use_uvloop=True) as server:
        child = subprocess.run(
            [sys.executable, "-c", code, server.base_url],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert child.returncode == 0, child.stderr
        assert child.stdout == BODY
        assert server.requests[0].json() == {"from": "child"}


def test_command_line_serves_files_in_order() -> None:
    second = FIXTURES / "anthropic" / "text_then_tool_use.sse"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "callgate.engine.runtime.replay", "--chunk-size", "50"),
            *(str(FIXTURE), str(second)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("serving 2 turn(s) at http://127.0.0.1:"), line
        base_url = line.split(" at ")[1].strip()
        with httpx.Client() as client:
            bodies = [client.post(base_url, json={}).content for _ in range(2)]
            exhausted = client.post(base_url, json={})
        assert bodies == [BODY, second.read_bytes()]
        assert exhausted.status_code == EXHAUSTED_STATUS
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"status": 42},
        {"chunk_size": 0},
        {"delay_s": -1.0},
        {"disconnect_after": -1},
        {"headers": {"x-evil": "a\r\nInjected: 1"}},
        {"headers": {"bad name": "v"}},
        {"headers": {"Content-Length": "3"}},
    ],
)
def test_invalid_turns_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ReplayTurn(**kwargs)  # type: ignore[arg-type]


def test_base_url_requires_a_running_server() -> None:
    with pytest.raises(ConfigError):
        _ = ReplayServer([]).base_url
