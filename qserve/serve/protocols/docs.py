"""The OpenAPI document, written from the routes' declarations, and its pages: /openapi.json, /docs, /redoc.

    curl -s 127.0.0.1:8000/openapi.json | python -c "import json, sys; print(sorted(json.load(sys.stdin)['paths']))"

Each route's entry comes from its spec.Route (its doc, Body and answer); the schemas are pydantic's, then narrowed to
this server's limits and default model (each protocol's OpenApi). The pages are FastAPI's Swagger UI and ReDoc.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from pydantic import BaseModel, TypeAdapter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from qserve import QserveError, __version__
from qserve.artifact import Manifest, read_manifest
from qserve.longtext import pattern
from qserve.serve.core.state import ServeState
from qserve.serve.infra.config import ServeConfig
from qserve.serve.protocols.spec import ProtocolSpec, Published, Route

TITLE = "qserve"
DESCRIPTION = (
    "Text classification with dynamic batching: an HF pipeline-style API "
    "(/v1) and the KServe V2 Open Inference Protocol (/v2)."
)
REF_TEMPLATE = "#/components/schemas/{model}"


def document(protocols: Sequence[ProtocolSpec], config: ServeConfig) -> dict[str, Any]:
    """The OpenAPI document of `protocols`' routes as this server serves them (its limits, its default model, its
    key: open routes need none)."""
    paths: dict[str, dict[str, Any]] = {}
    comps: dict[str, Any] = {}
    for p in protocols:
        for route in p.routes:
            op = operation(route, comps)
            if config.api_key and (route.open or (route.path == "/metrics" and config.metrics_public)):
                op["security"] = []
            paths.setdefault(route.path, {})[route.method.lower()] = op
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": TITLE, "description": DESCRIPTION, "version": __version__},
        "paths": paths,
        "components": {"schemas": dict(sorted(comps.items()))},
    }
    if config.api_key:  # the router enforces it; this makes /docs offer an Authorize button
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    doc = jsonable_encoder(doc, exclude_none=True)  # as FastAPI writes a document: no null values
    _publish(doc["components"]["schemas"], config, protocols)
    return doc


def operation(route: Route, comps: dict[str, Any]) -> dict[str, Any]:
    """One route's entry, FastAPI's way (its operationId, a path parameter as a string, "Successful Response"); the
    schemas it names are added to `comps`."""
    doc = route.doc
    name = route.name or route.answer.__name__
    op: dict[str, Any] = {
        "tags": doc.get("tags"),
        "summary": doc.get("summary"),
        "description": doc.get("description"),
        "operationId": re.sub(r"\W", "_", name + route.path) + "_" + route.method.lower(),
    }
    params = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string", "title": n.title()}}
        for n in re.findall(r"{(\w+)}", route.path)
    ]
    if params:
        op["parameters"] = params
    if route.body is not None:
        body = {"schema": schema(route.body.schema, comps, "validation")}
        op["requestBody"] = {"content": {"application/json": body}, "required": True}
    ok: dict[str, Any] = {"description": "Successful Response"}
    media = doc.get("media_type", "application/json")
    model = doc.get("response_model", typing.get_type_hints(route.answer).get("return"))
    if media == "text/html":
        ok["content"] = {media: {"schema": {"type": "string"}}}
    elif media:
        answered = model is None or (inspect.isclass(model) and issubclass(model, Response))
        ok["content"] = {media: {"schema": {} if answered else schema(model, comps)}}
    responses = {"200": ok}
    for code, extra in doc.get("responses", {}).items():
        entry = responses.setdefault(str(code), {"description": HTTPStatus(int(code)).phrase})
        entry["description"] = extra.get("description", entry["description"])
        content = entry.setdefault("content", {})
        if "model" in extra:
            content["application/json"] = {"schema": schema(extra["model"], comps)}
        content.update(extra.get("content", {}))
        if not content:
            del entry["content"]
    op["responses"] = responses
    return {**op, **doc.get("openapi_extra", {})}


def schema(tp: Any, comps: dict[str, Any], mode: str = "serialization") -> dict[str, Any]:
    """`tp`'s JSON schema as FastAPI writes it: a model by reference, its own schema and the models it holds added
    to `comps`."""
    out = TypeAdapter(tp).json_schema(ref_template=REF_TEMPLATE, mode=mode)  # type: ignore[arg-type]
    comps.update(out.pop("$defs", {}))
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        comps[tp.__name__] = out
        return {"$ref": REF_TEMPLATE.format(model=tp.__name__)}
    return out


def protocol(protocols: Sequence[ProtocolSpec], config: ServeConfig) -> ProtocolSpec:
    """The document's pages as routes, GET and HEAD, open and in no document: the document of `protocols`, built
    on its first request (the served model's manifest read then), and FastAPI's Swagger UI and ReDoc pages."""
    built: list[dict[str, Any]] = []

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    async def openapi(st: ServeState, body: bytes, request: Request) -> Response:
        if not built:
            built.append(document(protocols, config))
        # behind a proxy that strips a prefix: the document's server is that prefix (FastAPI's root_path_in_servers)
        return JSONResponse({**built[0], "servers": [{"url": root(request)}]} if root(request) else built[0])

    async def swagger(st: ServeState, body: bytes, request: Request) -> Response:
        url, redirect = root(request) + "/openapi.json", root(request) + "/docs/oauth2-redirect"
        return get_swagger_ui_html(openapi_url=url, title=f"{TITLE} - Swagger UI", oauth2_redirect_url=redirect)

    async def oauth2_redirect(st: ServeState, body: bytes, request: Request) -> Response:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(st: ServeState, body: bytes, request: Request) -> Response:
        return get_redoc_html(openapi_url=root(request) + "/openapi.json", title=f"{TITLE} - ReDoc")

    pages = {"/openapi.json": openapi, "/docs": swagger, "/docs/oauth2-redirect": oauth2_redirect, "/redoc": redoc}
    routes = tuple(Route(m, path, answer, open=True) for path, answer in pages.items() for m in ("GET", "HEAD"))
    return ProtocolSpec(name="docs", routes=routes)


def _served_manifest(variant_dir: str | None) -> Manifest | None:
    """The served variant's manifest, read once for the OpenAPI document (so the document is right before the
    model has loaded); None: no readable manifest (several models, a model dir, a repository)."""
    if not variant_dir:
        return None
    try:
        return read_manifest(Path(variant_dir))
    except (OSError, QserveError):
        return None


def _publish_long_text(comps: dict, manifest: Manifest | None, names: list[str]) -> None:
    """The long_text pattern bounded by the served variant's max_length, so a client knows which H and W this
    server takes. No readable manifest: the unbounded form stays."""
    if manifest is None:
        return
    shape, bounded = pattern(), pattern(manifest.max_length)
    for name in names:
        for alt in ((comps.get(name) or {}).get("properties", {}).get("long_text") or {}).get("anyOf", []):
            if alt.get("pattern") == shape:
                alt["pattern"] = bounded


def _publish(comps: dict[str, Any], config: ServeConfig, protocols: Sequence[ProtocolSpec]) -> None:
    """Write the server's own limits (--max-inputs, --max-chars) into the request schemas, so the document says
    exactly what this server accepts; then each protocol's own narrowing to the default model."""

    def walk(node: Any) -> None:  # Any: any node of the OpenAPI JSON document
        if isinstance(node, dict):
            if node.get("type") == "string" and "pattern" in node:  # a text (schemas.Text)
                node["maxLength"] = config.max_chars
            items = node.get("items")
            if (
                node.get("type") == "array"
                and isinstance(items, dict)
                and (
                    "pattern" in items
                    or items.get("type") == "array"  # a list of texts (maybe nested)
                    or any("pattern" in a for a in items.get("anyOf", []))
                )
            ):  # texts or text pairs
                node.setdefault("maxItems", config.max_inputs)
            for k, v in node.items():
                if k != "long_text":  # a policy string, not a text: _publish_long_text bounds it
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for name in dict.fromkeys(n for p in protocols for n in p.openapi.texts):
        walk(comps.get(name))
    manifest = _served_manifest(config.variant_dir)
    _publish_long_text(comps, manifest, [n for p in protocols for n in p.openapi.long_text])
    # `name=dir` (one named model): the document's answers (outputs, threshold) are that model's, as they always were
    answers = (
        manifest if "=" not in (config.variant_dir or "") else _served_manifest(config.variant_dir.split("=", 1)[-1])
    )
    published = Published(config, manifest, answers)
    for p in protocols:  # each protocol's schemas narrowed to this server and its default model
        if p.openapi.publish is not None:
            p.openapi.publish(comps, published)
