"""The KServe V2 / Open Inference Protocol as one declaration: its HTTP routes, their error words and OpenAPI
additions, and its gRPC service beside HTTP (registry.py serves it).

    qserve serve models/minilm-imdb-variants/onnx-int8 --grpc-port 8001   # V2 over HTTP on 8000, over gRPC on 8001

Its modules, one concept each (bodies, tensors, models, REST, repository, OpenAPI, gRPC): docs/architecture.md.
"""

from __future__ import annotations

from qserve.serve.core.state import ServeState
from qserve.serve.protocols.spec import ProtocolSpec, Running
from qserve.serve.protocols.v2 import openapi, repository, rest


async def start_grpc(st: ServeState) -> Running | None:
    """The V2 gRPC service on --grpc-port (none without it), on the app's event loop and serving state."""
    if st.config.grpc_port is None:
        return None
    from qserve.serve.protocols.v2.grpc_service import serve_grpc  # imports gRPC, an optional extra

    return await serve_grpc(st, st.config.host, st.config.grpc_port)


# The repository extension (repository.py) is V2's too: the same error shape, metrics label and bodies.
V2 = ProtocolSpec(
    name="v2",
    metrics_label="v2",
    expected=rest.expected,
    raw_body=True,
    hint="POST /v2/models/{name}/infer",
    openapi=openapi.OPENAPI,
    routes=(*rest.ROUTES, *repository.ROUTES),
    servers={"grpc": start_grpc},
)
