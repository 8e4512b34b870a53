"""The Chainlit app that ``python -m tunebook.chat`` runs (``chainlit run``); its settings come
from the environment that command sets (``tunebook.deploy.chat.ChatConfig``).

Per browser session: the conversation so far (sent with every message), a streamed reply with its
statistics, and a side panel refreshed from the server's /metrics by a background task. A failed
reply leaves the conversation as it was, so the next message works once the server is back.

The model's text is shown as text (``chat.Escaper``: its Markdown does not format), each reply is
capped at ``max_tokens`` (the command's ``--max-tokens``, changed per chat in the page's settings,
0 for none), and a model with dummy weights says so in the panel and under each reply.
"""

from __future__ import annotations

import asyncio
import logging

import chainlit as cl
import httpx
from chainlit.config import config
from chainlit.context import context
from chainlit.input_widget import Slider
from chainlit.session import WebsocketSession

from tunebook.deploy import chat

CFG = chat.ChatConfig.from_env()
# Chainlit's default config offers file uploads; replies here read only the text, so no button.
if config.features.spontaneous_file_upload is not None:
    config.features.spontaneous_file_upload.enabled = False
log = logging.getLogger("tunebook.chat")
_client: httpx.AsyncClient | None = None
_model: str | None = CFG.model
TITLE = "vLLM server"
_gone: dict[str, str] = {}  # session id -> the socket id it had when the page went away
_tasks: set[asyncio.Task] = set()


def client() -> httpx.AsyncClient:
    """One connection pool for the app; a read timeout bounds the wait for each chunk."""
    global _client
    if _client is None:
        _client = httpx.AsyncClient(timeout=httpx.Timeout(CFG.timeout_s, connect=5.0))
    return _client


async def model_name() -> str:
    """The model to ask for: --model, else the first the server lists (asked again after a
    failure, since a restarted server may serve another)."""
    global _model
    if _model is None:
        models = await chat.list_models(client(), CFG.url)
        if not models:
            raise chat.ChatError("http", f"{CFG.url}/models lists no model")
        _model = models[0]["id"]
    return _model


@cl.set_starters
async def starters(user=None, language=None):
    return [cl.Starter(label=p, message=p) for p in chat.ARTICLE_PROMPTS]


async def _refresh(panel: cl.CustomElement) -> None:
    """Update the side panel every refresh_s seconds while the page is connected, until Chainlit
    drops the session (a new chat, or session_timeout after the page went away).

    A page that reconnects (a laptop waking up) gets its session back under a new socket id and
    no new on_chat_start, so a disconnect pauses the loop rather than ending it.
    """
    session = context.session
    monitor = chat.Monitor(CFG, client())
    n = 0
    while WebsocketSession.get_by_id(session.id) is not None:
        if _gone.get(session.id) == session.socket_id:
            await asyncio.sleep(CFG.refresh_s)
            continue
        try:
            panel.props = await monitor.poll()
        except Exception as e:  # noqa: BLE001 - the panel says so and keeps trying
            panel.props = chat.panel_props(CFG, None, status="unreachable", message=repr(e))
        n += 1
        # The sidebar replaces its elements only when the key changes; the element keeps its
        # id, so the browser re-renders it in place. Emitting the element's dict directly (not
        # ElementSidebar.set_elements, which persists a new file for it every time) keeps a
        # long session from piling up files.
        # The title goes again too: the page drops the sidebar's state when it (re)connects.
        try:
            await context.emitter.emit("set_sidebar_title", TITLE)
            await context.emitter.emit(
                "set_sidebar_elements", {"elements": [panel.to_dict()], "key": f"tunebook-{n}"}
            )
        except Exception as e:  # noqa: BLE001 - a page gone mid-emit: the next round knows
            log.debug("panel update not sent: %r", e)
        await asyncio.sleep(CFG.refresh_s)
    _gone.pop(session.id, None)


MAX_TOKENS_MAX = 4096  # the settings slider's end (a reply of more is rare in a chat)


def settings_widgets() -> list:
    """The page's settings (the gear by the message box): the reply cap."""
    return [
        Slider(
            id="max_tokens",
            label="Reply cap (max_tokens; 0: none, the server's limit)",
            initial=CFG.max_tokens or 0,
            min=0,
            max=max(MAX_TOKENS_MAX, CFG.max_tokens or 0),
            step=16,
            description="Each reply stops after this many tokens.",
        )
    ]


@cl.on_settings_update
async def on_settings_update(settings: dict):
    cl.user_session.set("max_tokens", int(settings.get("max_tokens") or 0))


@cl.on_chat_start
async def on_chat_start():
    cl.user_session.set("history", [])
    cl.user_session.set("max_tokens", CFG.max_tokens or 0)
    await cl.ChatSettings(settings_widgets()).send()
    panel = cl.CustomElement(
        name=chat.PANEL_NAME, props=chat.panel_props(CFG, None), display="inline"
    )
    await cl.ElementSidebar.set_title(TITLE)
    await cl.ElementSidebar.set_elements([panel], key="tunebook-0")
    task = asyncio.create_task(_refresh(panel))
    _tasks.add(task)  # the loop keeps only weak references to tasks
    task.add_done_callback(_tasks.discard)


@cl.on_chat_end
async def on_chat_end():
    # Called on every disconnect: pause the panel until the page comes back (see _refresh).
    _gone[context.session.id] = context.session.socket_id


@cl.on_message
async def on_message(message: cl.Message):
    global _model
    history: list[dict] = cl.user_session.get("history")
    messages = [*history, {"role": "user", "content": message.content}]
    reply = cl.Message(content="")
    stats = chat.ReplyStats()
    text: list[str] = []
    shown = chat.Escaper()  # the model's text as text: its Markdown does not format
    try:
        cap = cl.user_session.get("max_tokens")
        body = chat.request_body(
            CFG, await model_name(), messages, max_tokens=CFG.max_tokens if cap is None else cap
        )
        async for piece in chat.stream_chat(client(), CFG.url, body, stats):
            text.append(piece)
            await reply.stream_token(shown.feed(piece))
    except chat.ChatError as e:
        log.warning("reply failed: %s", e)
        if e.kind in ("no_server", "interrupted"):
            _model = CFG.model
        if text:
            reply.content += "\n\n*(cut off)*"
            await reply.send()
        await cl.ErrorMessage(content=chat.explain(e, CFG)).send()
        return
    dummy = " · dummy weights: random text by design" if CFG.dummy_weights else ""
    reply.content = chat.escape_markdown("".join(text)) + f"\n\n*{stats.line()}{dummy}*"
    await reply.send()
    history += [messages[-1], {"role": "assistant", "content": "".join(text)}]
