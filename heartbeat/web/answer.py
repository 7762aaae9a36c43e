"""The page's one write: a person answers a question across the seam from the task's page.

``POST /tasks/ID/questions/QID/answer`` with ``answer=TEXT&form=VALUE``
(``application/x-www-form-urlencoded``) answers through :func:`heartbeat.tasks.questions.answer`,
as ``heartbeat answer`` does, by ``person:web``: the gate lifts and the ledger records ``answered``
like the command's. Before anything is read, :class:`heartbeat.web.guard._Guard` has checked the
Host header, the token and that the request is same-origin; here: the form's anti-forgery value
(an HMAC over the task and the question, keyed by the server's secret), the content type, a body
bounded by the answer's own cap. A refused request writes nothing; the answer's own refusals
(answered already, unknown qid, too long) come back as the task page with that one line. A
written answer is a ``303`` back to the task page.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from heartbeat.model import defaults
from heartbeat.model.baton import ID_PATTERN, QID_PATTERN
from heartbeat.model.errors import BadInput, Conflict, HeartbeatError, NotFound

__all__ = ["ANSWER_PATH", "BY", "MAX_BODY", "FormKey", "is_answer_path", "answer_endpoint"]

ANSWER_PATH = re.compile(rf"/tasks/{ID_PATTERN.pattern}/questions/{QID_PATTERN.pattern}/answer")
"""The one path that takes a POST (the guard refuses POST, and every other write verb, elsewhere)."""

BY = "person:web"
"""``answered_by`` of an answer given on the page (the CLI's is ``person`` or ``person:NAME``)."""

MAX_BODY = defaults.MAX_ANSWER_CHARS * 12 + 1024
"""The longest body read: an answer at its cap with every character four UTF-8 bytes, each
percent-encoded (``%XX``: 12 bytes a character), and the form's other fields. A longer one is
refused (413) before it is read whole."""

FORM_TYPE = "application/x-www-form-urlencoded"


def is_answer_path(path: str) -> bool:
    return ANSWER_PATH.fullmatch(path) is not None


class FormKey:
    """The anti-forgery values of the page's answer forms: an HMAC of the task and the question id.

    Keyed by the token when there is one (a page rendered by the daemon's server posts to a
    ``heartbeat web`` beside it), else by a secret drawn when the server starts (a Unix socket:
    a form rendered before a restart is refused; reload the page). Whoever holds the token can read
    the page and its forms anyway; what the value stops is a page elsewhere that cannot read ours.
    """

    def __init__(self, token: str) -> None:
        secret = token.encode("utf-8", "surrogateescape") if token else secrets.token_bytes(32)
        self._key = hmac.new(secret, b"heartbeat web: answer form", hashlib.sha256).digest()

    def value(self, task_id: str, qid: str) -> str:
        return hmac.new(self._key, f"{task_id}\n{qid}".encode(), hashlib.sha256).hexdigest()

    def check(self, task_id: str, qid: str, given: str) -> bool:
        return hmac.compare_digest(self.value(task_id, qid).encode(), given.encode("utf-8", "surrogateescape"))


class Refused(Exception):
    """A request the write refuses before it reaches the baton: its status and one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


async def _body(request: Any) -> bytes:
    """The request's body, at most :data:`MAX_BODY` bytes, or :class:`Refused`."""
    kind, _, params = request.headers.get("content-type", "").partition(";")
    charset = params.strip().lower()
    if kind.strip().lower() != FORM_TYPE or charset not in ("", "charset=utf-8"):
        raise Refused(415, f"an answer is posted as {FORM_TYPE} (UTF-8), the page's form")
    length = request.headers.get("content-length", "")
    too_big = Refused(413, f"the request is over {MAX_BODY} bytes: an answer is at most "
                           f"{defaults.MAX_ANSWER_CHARS} characters")
    if length and (not length.isdigit() or int(length) > MAX_BODY):
        raise too_big
    body = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > MAX_BODY:
                raise too_big

    try:
        # A body trickled in forever would hold its connection: the same bound as a request's arrival.
        await asyncio.wait_for(read(), defaults.WEB_REQUEST_TIMEOUT)
    except TimeoutError:
        raise Refused(408, f"the form's body did not arrive within {defaults.WEB_REQUEST_TIMEOUT:g}s") from None
    return bytes(body)


def _fields(body: bytes) -> tuple[str, str]:
    """The form's ``answer`` and ``form`` fields, each once, or :class:`Refused`."""
    try:
        text = body.decode("utf-8")
        fields = parse_qs(text, keep_blank_values=True, strict_parsing=bool(text), max_num_fields=4,
                          errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "the form is not UTF-8 form data") from None
    if any(len(v) != 1 for v in fields.values()) or not {"answer", "form"} <= fields.keys():
        raise Refused(400, "the form needs one `answer` and one `form` field")
    return fields["answer"][0].replace("\r\n", "\n"), fields["form"][0]


def answer_endpoint(store: Any, key: FormKey, *, link: Callable[[Any, str], str],
                    task_page: Callable[..., Any]) -> Callable[[Any], Any]:
    """The handler of ``POST /tasks/ID/questions/QID/answer``. ``link(request, path)``: a URL
    carrying the page's token along; ``task_page(request, task_id, status_code=..., answer_error=...,
    draft=...)``: the task page showing a refusal beside the question's form."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import PlainTextResponse, RedirectResponse

    from heartbeat.tasks import questions

    async def endpoint(request: Any) -> Any:
        task_id, qid = request.path_params["task_id"], request.path_params["qid"]
        try:
            text, given = _fields(await _body(request))
            if not key.check(task_id, qid, given):
                raise Refused(403, "this form was not served by this page (its anti-forgery value does not "
                                   "match): reload the task's page and answer there")
        except Refused as exc:
            return PlainTextResponse(exc.message + "\n", exc.status, headers={"Cache-Control": "no-store"})
        try:
            await run_in_threadpool(questions.answer, store, task_id, qid, text, by=BY, actor=BY)
        except HeartbeatError as exc:
            status = 409 if isinstance(exc, Conflict) else 404 if isinstance(exc, NotFound) else 400 \
                if isinstance(exc, BadInput) else 503
            return await run_in_threadpool(task_page, request, task_id, status_code=status,
                                           answer_error={"qid": qid, "message": str(exc)}, draft=text)
        return RedirectResponse(link(request, f"/tasks/{task_id}") + f"#{qid}", status_code=303)

    return endpoint
