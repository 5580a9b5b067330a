"""The KServe V2 gRPC API (inference.GRPCInferenceService, as tritonclient.grpc speaks it), beside HTTP.

    qserve serve models/minilm-imdb-variants/onnx-int8 --grpc-port 8001
    python -c "import numpy as np, tritonclient.grpc as t; c = t.InferenceServerClient('127.0.0.1:8001'); \\
i = t.InferInput('text', [1], 'BYTES'); i.set_data_from_numpy(np.array([b'great'], dtype=object)); \\
print(c.infer('onnx-int8', [i]).as_numpy('probabilities'))"

On HTTP's event loop, through its admission layer: the same models, batches, key, limits, errors (STATUS), metrics."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from qserve import __version__
from qserve.serve.core.answer import InferenceRequest, Origin
from qserve.serve.core.served_model import ServedModel
from qserve.serve.core.state import ServeState
from qserve.serve.core.texts import unicode_problem
from qserve.serve.infra.admission import GRPC
from qserve.serve.infra.errors import ApiError
from qserve.serve.infra.tracing import TRACE_HEADER
from qserve.serve.protocols.v2 import repository as repo
from qserve.serve.protocols.v2.models import EXTENSIONS, model_config, model_metadata, served
from qserve.serve.protocols.v2.tensors import (
    answered_outputs,
    bytes_elements,
    named_inputs,
    output_values,
    shaped,
    tensor_bytes,
    utf8,
)

log = logging.getLogger("qserve.serve")
# The request and reply types are the messages tritonclient's generated modules define (service_pb2: the RPC's name
# plus Request / Response); they ship no type stubs, so they are Any here.
Scope = dict[str, Any]
"""The ASGI-scope stand-in of one RPC: {"state": {...}}, what ServeState.submit reads and writes."""
Reply = TypeVar("Reply")
Context: TypeAlias = grpc.aio.ServicerContext
SERVICE = "inference.GRPCInferenceService"
ORIGIN = Origin("v2-grpc", "parameters.long_text")
OPEN_METHODS = frozenset({"ServerLive", "ServerReady"})  # probes, as /v2/health/* on HTTP
STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
INPUT_RULE = (
    "send one BYTES input named 'text' of shape [n] or [n, 1], plus 'text_pair' of the same shape for a "
    "text-pair model (GET the model metadata)"
)


class GrpcServer:
    """The running grpc.aio server and the port it bound."""

    def __init__(self, server: grpc.aio.Server, port: int):
        self.server, self.port = server, port

    async def stop(self, grace_s: float = 5.0) -> None:
        await self.server.stop(grace_s)


async def serve_grpc(st: ServeState, host: str, port: int) -> GrpcServer:
    """Serve the V2 gRPC API for `st` on host:port (0 = any free port) on the running event loop."""
    limit = st.config.max_body_bytes
    # gRPC's own cap, above --max-body-bytes so that the service refuses with the HTTP message (413);
    # it still bounds what is ever parsed.
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 2 * limit + 4096), ("grpc.max_send_message_length", -1)]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(V2Servicer(st), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_insecure_port(address)
    if not bound:
        raise RuntimeError(f"--grpc-port: could not bind {address}")
    await server.start()
    log.info("KServe V2 gRPC on %s:%d", host, bound)
    return GrpcServer(server, bound)


def rpc(answer: Callable[[Any, Any, Context, Scope, str], Awaitable[Reply]]) -> Callable[..., Awaitable[Reply]]:
    """An RPC method from its answer, `answer(self, request, context, scope, request_id)`, run through `_call`."""

    async def method(self: V2Servicer, request: Any, context: Context) -> Reply:
        return await self._call(answer.__name__, context, lambda scope, rid: answer(self, request, context, scope, rid))

    return method


class V2Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, st: ServeState):
        self.st = st

    async def _call(self, method: str, context: Context, handler: Callable[[Scope, str], Awaitable[Reply]]) -> Reply:
        """One RPC through the admission layer (the request id, its trace, the key, its arrival, its metrics), its
        errors mapped to gRPC codes."""
        admission = self.st.admission
        meta = {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        scope: Scope = {"state": {}}  # what state.submit reads from an ASGI scope
        open_ = method in OPEN_METHODS
        trace = (
            None
            if open_
            else (f"{SERVICE}/{method}", meta, {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method})
        )
        call = admission.enter(scope, f"/{SERVICE}/{method}", "GRPC", meta.get("x-request-id"), trace)
        rid = call.request_id
        if call.trace is not None:
            await context.send_initial_metadata(((TRACE_HEADER, call.trace.trace_id),))
        status = 200
        try:
            admission.admit(call, GRPC, meta.get("authorization"), open=open_, arriving=method == "ModelInfer")
            return await handler(scope, rid)
        except ApiError as e:
            status = e.status
            trailing = [("x-request-id", rid)] + [(k.lower(), v) for k, v in e.headers.items()]
            message = e.message.encode("utf-8", "backslashreplace").decode("utf-8")
            await context.abort(STATUS.get(e.status, grpc.StatusCode.UNKNOWN), message, tuple(trailing))
        except grpc.aio.AbortError:
            raise
        except Exception:
            status = 500
            log.exception("request %s: unhandled error in %s", rid, method)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"internal error; quote request id {rid}", (("x-request-id", rid),)
            )
        finally:
            admission.leave(
                call, status, trace_attributes={"rpc.grpc.status_code": STATUS.get(status, grpc.StatusCode.OK).value[0]}
            )
        raise AssertionError("unreachable: context.abort() raises grpc.aio.AbortError")  # pragma: no cover

    # -- health and metadata -------------------------------------------------------------------
    @rpc
    async def ServerLive(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    @rpc
    async def ServerReady(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.st.ready)

    @rpc
    async def ServerMetadata(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        return service_pb2.ServerMetadataResponse(name="qserve", version=__version__, extensions=EXTENSIONS)

    def _model(self, name: str, version: str, scope: Scope) -> ServedModel:
        """The model called `name` (empty: the default), at `version` (empty: the latest, as Triton reads it)."""
        return served(self.st, name, version, scope)

    @rpc
    async def ModelReady(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        if not self.st.ready:  # as tritonclient reads HTTP's 503: not ready, not an error
            return service_pb2.ModelReadyResponse(ready=False)
        self._model(request.name, request.version, scope)
        return service_pb2.ModelReadyResponse(ready=True)

    @rpc
    async def ModelMetadata(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        m = model_metadata(self._model(request.name, request.version, scope))
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=m["name"],
            versions=m["versions"],
            platform=m["platform"],
            inputs=[tensor(**t) for t in m["inputs"]],
            outputs=[tensor(**t) for t in m["outputs"]],
        )

    @rpc
    async def ModelConfig(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        model = self._model(request.name, request.version, scope)
        cfg = model_config(self.st, model)
        # The proto's version_policy holds int64 versions; ours are manifest hashes: the one version
        # serving now goes in the parameters instead (ModelMetadata's versions list it too).
        cfg["version_policy"] = {"latest": {"num_versions": 1}}
        cfg["parameters"]["model_version"] = {"string_value": model.version}
        return service_pb2.ModelConfigResponse(config=json_format.ParseDict(cfg, model_config_pb2.ModelConfig()))

    # -- inference ------------------------------------------------------------------------------
    @rpc
    async def ModelInfer(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        st = self.st
        if request.ByteSize() > st.admission.max_body_bytes:
            raise st.admission.too_large()
        model = self._model(request.model_name, request.model_version, scope)
        if unicode_problem(request.id):
            raise ApiError(422, f"id {unicode_problem(request.id)}")
        texts, pairs = request_texts(st, request, model)
        asked = [o.name for o in request.outputs]  # none: all of the model's (submit resolves them)
        policy, outputs, deadline = _long_text(request), answered_outputs(asked), context.time_remaining()
        req = InferenceRequest(model.name, texts, ORIGIN, scope, rid, pairs, policy, None, outputs, deadline)
        a = await st.submit(req)
        values = output_values(a)
        out = service_pb2.ModelInferResponse(model_name=a.name, model_version=a.version, id=request.id or rid)
        out.parameters["labels"].string_param = ",".join(a.labels)
        out.parameters["max_length"].int64_param = a.max_length
        out.parameters["long_text"].string_param = a.policy
        for name in a.outputs:
            meta, data = values[name]
            out.outputs.add(name=name, datatype=meta["datatype"], shape=meta["shape"])
            out.raw_output_contents.append(tensor_bytes(meta["datatype"], data))
        return out

    # -- the repository extension (repository.py: the same calls as HTTP) ------------------------------
    @rpc
    async def RepositoryIndex(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        _repository(request.repository_name)
        entry = service_pb2.RepositoryIndexResponse.ModelIndex
        return service_pb2.RepositoryIndexResponse(models=[entry(**m) for m in repo.index(self.st, request.ready)])

    @rpc
    async def RepositoryModelLoad(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        _repository(request.repository_name)
        scope["state"]["qserve_model"] = repo.model_label(self.st, request.model_name, loading=True)
        await repo.load(self.st, request.model_name, list(request.parameters))
        return service_pb2.RepositoryModelLoadResponse()

    @rpc
    async def RepositoryModelUnload(self, request: Any, context: Context, scope: Scope, rid: str) -> Any:
        _repository(request.repository_name)
        scope["state"]["qserve_model"] = repo.model_label(self.st, request.model_name, loading=False)
        await repo.unload(self.st, request.model_name)
        return service_pb2.RepositoryModelUnloadResponse()


def _repository(name: str) -> None:
    if name:
        raise ApiError(400, f"repository_name {name!r}: this server has one model repository; leave it empty")


def _long_text(request: service_pb2.ModelInferRequest) -> str | None:
    """ModelInfer's parameters.long_text (a string_param), else None: the model's default policy."""
    if "long_text" not in request.parameters:
        return None
    p = request.parameters["long_text"]
    if p.WhichOneof("parameter_choice") != "string_param":
        raise ApiError(
            422, "parameters.long_text must be a string_param: head, tail, head-tail[:H] or windows[:W[:S[:mean|max]]]"
        )
    return p.string_param


def request_texts(
    st: ServeState, req: service_pb2.ModelInferRequest, model: ServedModel
) -> tuple[list[str], list[str] | None]:
    """(texts, text pairs or None) of a ModelInferRequest: `text`, and `text_pair` for a pair model, checked
    as the HTTP /v2 route checks them (tensors.named_inputs)."""
    if not 1 <= len(req.inputs) <= 2:
        raise ApiError(422, f"the request has {len(req.inputs)} inputs; {INPUT_RULE}")
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise ApiError(400, f"raw_input_contents has {len(raw)} entries for {len(req.inputs)} input(s)")
    named: dict[str, tuple[int, list[str]]] = {}
    for i, tensor in enumerate(req.inputs):
        if tensor.name not in ("text", "text_pair") or tensor.name in named:
            raise ApiError(422, f"inputs[{i}].name is {tensor.name!r}; {INPUT_RULE}")
        if tensor.datatype != "BYTES":
            raise ApiError(422, f"inputs[{i}].datatype is {tensor.datatype!r}; {INPUT_RULE}")
        named[tensor.name] = (i, _tensor_texts(tensor, raw[i] if raw else None, i))
    return named_inputs(st, model, named)


def _tensor_texts(tensor: service_pb2.ModelInferRequest.InferInputTensor, raw: bytes | None, i: int) -> list[str]:
    listed = list(tensor.contents.bytes_contents)
    if raw is not None and listed:
        raise ApiError(400, f"inputs[{i}] has both raw_input_contents and contents.bytes_contents; send one of them")
    if raw is not None:
        data = bytes_elements(raw, f"inputs[{i}]")
    elif listed:
        data = [utf8(b, f"inputs[{i}][{j}]") for j, b in enumerate(listed)]
    else:
        raise ApiError(
            400,
            f"inputs[{i}] has no data: send the texts in raw_input_contents (tritonclient's "
            "set_data_from_numpy) or in contents.bytes_contents",
        )
    return shaped(i, list(tensor.shape), data)
