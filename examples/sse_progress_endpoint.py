"""A browser watches an operation live: callgate's progress events as Server-Sent Events.

    python examples/sse_progress_endpoint.py --selftest       # drive the app in-process
    python examples/sse_progress_endpoint.py --serve          # needs an ASGI server:
                                                              #   pip install uvicorn

A plain ASGI application, with no web framework, so the example has no dependency
callgate does not already have. The endpoints map one to one onto Starlette or FastAPI
routes (``StreamingResponse(frames, media_type="text/event-stream")``):

    GET  /                          a page that shows the stream and approval buttons
    GET  /events?prompt=TEXT        start an operation, stream its progress
    POST /decide?approval=ID&approve=1|0   record a person's decision (JSON reply)
    GET  /resume?operation=ID       resume after the decision, stream its progress

The stream carries every ``ProgressEvent`` (``event:`` is its tag: state, preparing, text,
rejected, approval, executed, ended) and a final ``result``. The operation never depends
on the browser: if the page goes away mid-stream, the operation still runs to its pause
or its end, and its state is in the store.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import msgspec

from callgate.engine.core.registry import Registry
from callgate.engine.runtime.demo_scenarios import SCENARIOS, render_script
from callgate.engine.runtime.demo_tools import (
    DEMO_ROLES,
    DEMO_SUBJECT,
    DEMO_TENANT,
    Downstream,
    build_registry,
)
from callgate.engine.runtime.loop import OperationResult, Runner
from callgate.engine.runtime.progress import ProgressEvent, ProgressSink
from callgate.engine.runtime.replay import ReplayServer
from callgate.engine.runtime.transport import ProviderEndpoint
from callgate.engine.store import Store, open_store

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PAGE = b"""<!doctype html><meta charset="utf-8"><title>callgate: live progress</title>
<h1>Refund assistant</h1><pre id="log"></pre><div id="ask"></div>
<script>
const out = () => document.getElementById("log");
const log = (t) => {
  if (out().textContent && !out().textContent.endsWith("\\n")) out().textContent += "\\n";
  out().textContent += t + "\\n";
};
const kinds = ["state", "preparing", "text", "rejected", "approval", "executed", "ended"];
function watch(url) {
  const es = new EventSource(url);
  for (const kind of kinds) es.addEventListener(kind, (e) => show(kind, JSON.parse(e.data)));
  // close on the final frame, or the browser would reconnect and start a new operation
  es.addEventListener("result", (e) => { es.close(); log("result " + e.data); });
}
function show(kind, d) {
  if (kind === "text") return void (out().textContent += d.text);
  if (kind === "preparing") return log("the model is preparing to call " + d.name + " ...");
  if (kind === "approval") {
    const ask = document.getElementById("ask");
    for (const [label, yes] of [["Approve", 1], ["Deny", 0]]) {
      const b = document.createElement("button");
      b.textContent = label + " " + d.name;
      b.onclick = async () => {
        ask.replaceChildren();
        const r = await fetch("/decide?approval=" + d.approval_id + "&approve=" + yes,
                              {method: "POST"});
        watch("/resume?operation=" + (await r.json()).operation_id);
      };
      ask.append(b);
    }
  }
  log(kind + " " + JSON.stringify(d));
}
watch("/events?prompt=" + encodeURIComponent("Order 4815 arrived damaged. Refund it in full."));
</script>
"""


class ProgressApp:
    """The ASGI app. Per request it builds a ``Runner`` whose progress sink feeds that
    request's stream; the store, the registry and the model endpoint are shared."""

    def __init__(self, *, provider: str, model: str, live: bool, workdir: str) -> None:
        self.provider, self.model, self.live, self.workdir = provider, model, live, workdir
        self._stack = contextlib.AsyncExitStack()
        self.store: Store | None = None
        self.registry: Registry | None = None
        self.endpoint: ProviderEndpoint | None = None

    async def startup(self) -> None:
        if self.live:
            self.endpoint = ProviderEndpoint.from_env(self.provider)
        else:  # the demo's scripted refund conversation, served 50 times over
            turns = render_script(SCENARIOS["refund"], self.provider, model=self.model) * 50
            server = await self._stack.enter_async_context(ReplayServer(turns))
            self.endpoint = ProviderEndpoint(base_url=server.base_url, api_key="unused")
        url = f"sqlite:///{self.workdir}/callgate.db"
        self.store = await self._stack.enter_async_context(open_store(url))
        downstream = Downstream(f"{self.workdir}/downstream.db")
        await anyio.to_thread.run_sync(downstream.reset)
        self.registry = build_registry(downstream)

    async def shutdown(self) -> None:
        await self._stack.aclose()

    def runner(self, sink: ProgressSink) -> Runner:
        assert self.registry is not None and self.store is not None
        return Runner(
            provider=self.provider,
            model=self.model,
            registry=self.registry,
            endpoint=self.endpoint,
            store=self.store,
            progress=sink,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(self, receive, send)
            return
        if scope["type"] != "http":
            return
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        arg = {k: v[0] for k, v in query.items()}
        route = (scope["method"], scope["path"])
        if route == ("GET", "/"):
            await _respond(send, 200, "text/html; charset=utf-8", PAGE)
        elif route == ("GET", "/events") and arg.get("prompt"):
            prompt = arg["prompt"][:2000]
            await _stream(
                send,
                lambda sink: self.runner(sink).start(
                    prompt, tenant=DEMO_TENANT, subject=DEMO_SUBJECT, roles=DEMO_ROLES
                ),
            )
        elif route == ("POST", "/decide") and arg.get("approval"):
            assert self.store is not None
            approval = await self.store.decide_approval(
                arg["approval"], arg.get("approve") == "1", "browser user", None, now=time.time()
            )
            body = msgspec.json.encode({"operation_id": approval.operation_id})
            await _respond(send, 200, "application/json", body)
        elif route == ("GET", "/resume") and arg.get("operation"):
            operation_id = arg["operation"]
            await _stream(send, lambda sink: self.runner(sink).resume(operation_id))
        else:
            await _respond(send, 404, "text/plain", b"not found\n")


async def _lifespan(app: ProgressApp, receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await app.startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await app.shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(send: Send, status: int, content_type: str, body: bytes) -> None:
    headers = [(b"content-type", content_type.encode()), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def frame(event: str, data: bytes) -> bytes:
    """One SSE frame. ``data`` is single-line JSON, so it needs one ``data:`` line."""
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


async def _stream(
    send: Send, operate: Callable[[ProgressSink], Awaitable[OperationResult]]
) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    events_in, events_out = anyio.create_memory_object_stream[ProgressEvent](64)
    results: list[OperationResult] = []
    connected = True

    async def run() -> None:
        async with events_in:  # closing it ends the forwarding loop below
            results.append(await operate(events_in.send))

    async def push(chunk: bytes) -> None:
        nonlocal connected
        if connected:
            try:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except OSError:  # the browser went away; the operation carries on
                connected = False

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        async with events_out:
            async for event in events_out:
                tag = type(event).__struct_config__.tag
                await push(frame(str(tag), msgspec.json.encode(event)))
    result = results[0]
    summary = {"operation_id": result.operation_id, "state": result.state.value}
    summary |= {"text": result.text, "pending_approvals": list(result.pending_approvals)}
    await push(frame("result", msgspec.json.encode(summary)))
    if connected:
        await send({"type": "http.response.body", "body": b"", "more_body": False})


# --- running it ------------------------------------------------------------------------------


async def selftest(app: ProgressApp) -> int:
    """Serve the app to itself: lifespan, one operation, the decision, the resume."""
    to_app, app_in = anyio.create_memory_object_stream[Message](4)
    app_out, from_app = anyio.create_memory_object_stream[Message](4)
    async with anyio.create_task_group() as tg:
        tg.start_soon(app, {"type": "lifespan"}, app_in.receive, app_out.send)
        await to_app.send({"type": "lifespan.startup"})
        assert (await from_app.receive())["type"] == "lifespan.startup.complete"
        prompt = urllib.parse.quote("Order 4815 arrived damaged. Refund it in full.")
        started = await _request(app, "GET", "/events", f"prompt={prompt}")
        approval = _last(started, "approval")["approval_id"]
        decided = await _request(app, "POST", "/decide", f"approval={approval}&approve=1")
        operation = msgspec.json.decode(decided)["operation_id"]
        resumed = await _request(app, "GET", "/resume", f"operation={operation}")
        await to_app.send({"type": "lifespan.shutdown"})
        assert (await from_app.receive())["type"] == "lifespan.shutdown.complete"
    final = _last(resumed, "result")
    print(f"final state: {final['state']}")
    return 0 if final["state"] == "completed" else 1


async def _request(app: ProgressApp, method: str, path: str, query: str) -> bytes:
    body = bytearray()

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            print(f"--- {method} {path} -> {message['status']}")
        elif message.get("body"):
            body.extend(message["body"])
            if not message["body"].startswith(b"event: text\n"):  # text deltas: too chatty
                sys.stdout.write(message["body"].decode())

    scope = {"type": "http", "method": method, "path": path, "query_string": query.encode()}
    await app(scope, receive, send)
    print()
    return bytes(body)


def _last(stream: bytes, event: str) -> dict[str, Any]:
    frames = [f for f in stream.split(b"\n\n") if f.startswith(b"event: " + event.encode())]
    data: dict[str, Any] = msgspec.json.decode(frames[-1].split(b"\ndata: ", 1)[1])
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--selftest", action="store_true", help="drive the app in-process")
    mode.add_argument("--serve", action="store_true", help="serve it with uvicorn")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--provider", default="openai_responses")
    parser.add_argument("--model", default="gpt-4.1-mini")
    parser.add_argument("--live", action="store_true", help="call the real provider API")
    args = parser.parse_args(argv)
    app = ProgressApp(
        provider=args.provider,
        model=args.model,
        live=args.live,
        workdir=tempfile.mkdtemp(prefix="callgate-sse-"),
    )
    if args.serve:
        try:
            import uvicorn  # type: ignore[import-not-found]  # noqa: PLC0415 - optional
        except ImportError:
            print("--serve needs an ASGI server: pip install uvicorn", file=sys.stderr)
            return 2
        uvicorn.run(app, host="127.0.0.1", port=args.port, lifespan="on")
        return 0
    if args.selftest:
        return anyio.run(selftest, app)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
