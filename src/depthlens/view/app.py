"""The explorer's web app: one page (``static/``) drawn from a JSON API over one store. Read-only: GET only.

Starlette (the framework under FastAPI, which the vllm extra installs) serves it: a handful of routes, a static
directory that refuses paths outside it, no request models to declare — so not FastAPI itself. The state of a
view lives in its URL (``#/q/<id>?n=8&eta=0.5…``), as Datasette keeps it, so a view can be linked and reloaded.

Routes: ``/`` the page; ``/static/…`` its script and style; ``/api/run``, ``/api/voting``, ``/api/questions``,
``/api/question``, ``/api/response``, ``/api/records``. Anything else — a store file, ``..`` (encoded or not) —
is 404: the store is read only through the API.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from depthlens.config import VotingConfig
from depthlens.errors import DepthlensError
from depthlens.view import api
from depthlens.view.detail import Labeller, response_detail
from depthlens.view.pools import VotingIndex
from depthlens.view.said import said
from depthlens.view.store import ViewStore

STATIC = Path(__file__).parent / "static"
_MAX_PAGE = 500


class BadQuery(Exception):
    """A query parameter the API cannot use (answered 400 with its message)."""


@dataclasses.dataclass
class Explorer:
    """One store and what the page needs over it, built once: the voting index and the token labeller are
    filled in the background (``start``) so the first page never waits for them."""

    store: ViewStore
    index: VotingIndex | None
    labeller: Labeller
    voting: VotingConfig
    questions: list[dict[str, Any]]
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _threads: list[threading.Thread] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, store: ViewStore) -> Explorer:
        index = VotingIndex(store) if store.kind == "samples" else None
        # a score store keeps its tokens' labels; its layer predictions (ids) are labelled by the tokenizer too
        labeller = Labeller(store.manifest.get("model") if store.kind != "tcb" else None)
        rows = api.question_rows(store) if store.kind == "samples" else []
        return cls(store, index, labeller, api.default_voting(store), rows)

    def start(self) -> None:
        """Build the voting index on a daemon thread (stopped by ``stop``); the tokenizer follows the first
        page (``Labeller.start``)."""
        if self.index is not None:
            thread = threading.Thread(target=self._build, name="view-index", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _build(self) -> None:
        from depthlens.stores.shortfall import quiet

        assert self.index is not None
        with quiet():  # a store's shortfall is the page's own notice, not a warning on stderr
            self.index.build(self.stop)

    def close(self, wait_s: float = 10.0) -> None:
        """Stop the index build and wait for it to leave Arrow and torch (it checks ``stop`` between shards)."""
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=wait_s)


def _int(request: Request, name: str, default: int, low: int = 0, high: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadQuery(f"{name}={raw!r}: give a whole number") from None
    if value < low or (high is not None and value > high):
        raise BadQuery(f"{name}={value}: must be in [{low}, {high if high is not None else '∞'}]")
    return value


def _voting(request: Request, base: VotingConfig) -> VotingConfig:
    """The voting settings of the query (n, eta, prefix = a number or 'full', trials, seed, tie_break) over
    ``base``."""
    q = request.query_params
    prefix_raw = q.get("prefix")
    if prefix_raw in (None, ""):
        prefix = base.rank_prefix
    elif prefix_raw == "full":
        prefix = None
    else:
        prefix = _int(request, "prefix", 0, low=1)
    try:
        eta = float(q["eta"]) if q.get("eta") else base.eta
    except ValueError:
        raise BadQuery(f"eta={q['eta']!r}: give a number in (0, 1]") from None
    try:
        return dataclasses.replace(
            base,
            n=_int(request, "n", base.n, low=1),
            eta=eta,
            rank_prefix=prefix,
            trials=_int(request, "trials", base.trials, low=1, high=1000),
            seed=_int(request, "seed", base.seed),
            tie_break=q.get("tie_break") or base.tie_break,  # type: ignore[arg-type]  # text: VotingConfig checks it
        )
    except DepthlensError as exc:  # named as the query spells it (eta=1.5: …), never as a Python field
        raise BadQuery(said(exc)) from None
    except ValueError as exc:  # a number that does not parse
        raise BadQuery(str(exc)) from None


def _page(request: Request, sort: str) -> dict[str, Any]:
    q = request.query_params
    return {
        "page": _int(request, "page", 0),
        "size": _int(request, "size", 50, low=1, high=_MAX_PAGE),
        "sort": q.get("sort", sort),
        "order": q.get("order", "asc"),
        "filter": q.get("filter", "all"),
        "method": q.get("method", "think@n"),
    }


class _Json(JSONResponse):
    """Starlette's JSON, except a stored text UTF-8 cannot encode (a lone surrogate, edited outside depthlens, which
    the page's notice names): written as a JSON escape (``\\ud800``), as ``depthlens export`` writes it, not a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def _answer(handler: Callable[[Request], Any]) -> Callable[[Request], JSONResponse]:
    """A route answering ``handler``'s JSON; a bad query is 400, an unknown id 404, both with a message."""

    def route(request: Request) -> JSONResponse:
        try:
            return _Json(handler(request))
        except BadQuery as exc:
            return _Json({"error": str(exc)}, status_code=400)
        except DepthlensError as exc:
            return _Json({"error": said(exc)}, status_code=400)
        except LookupError as exc:
            return _Json({"error": str(exc.args[0]) if exc.args else "not found"}, status_code=404)

    return route


def make_app(explorer: Explorer) -> Starlette:
    """The app over ``explorer``'s store (its background work started by the caller: ``Explorer.start``)."""
    store = explorer.store

    def samples_only() -> VotingIndex:
        if explorer.index is None:
            raise LookupError("this is a score store: it has no questions or voting (see /api/records)")
        return explorer.index

    def run(request: Request) -> Any:
        return api.run_info(store, explorer.index, explorer.voting)

    def voting(request: Request) -> Any:
        return api.voting_table(store, samples_only(), _voting(request, explorer.voting))

    def questions(request: Request) -> Any:
        index = samples_only()
        explorer.labeller.start()  # the first page is out: a response page will want its tokens
        return api.questions_page(
            explorer.questions, index, _voting(request, explorer.voting), _page(request, "agreement")
        )

    def question(request: Request) -> Any:
        samples_only()
        qid = request.query_params.get("id", "")
        if qid not in store.questions:
            raise LookupError(f"no question {qid!r} in this store")
        settings = _voting(request, explorer.voting)
        trial = _int(request, "trial", 0, high=settings.trials - 1)
        return api.question_detail(store, qid, settings, trial)

    def response(request: Request) -> Any:
        rid = request.query_params.get("id", "")
        if rid not in store.by_id:
            raise LookupError(f"no response or record {rid!r} in this store")
        return response_detail(store, store.by_id[rid], explorer.labeller)

    def records(request: Request) -> Any:
        explorer.labeller.start()
        return api.records_page(store, _page(request, "store"))

    def page(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html")

    routes = [Route("/", page), Mount("/static", StaticFiles(directory=STATIC), name="static")]
    for name, handler in {
        "run": run,
        "voting": voting,
        "questions": questions,
        "question": question,
        "response": response,
        "records": records,
    }.items():
        routes.append(Route(f"/api/{name}", _answer(handler)))
    return Starlette(routes=routes)
