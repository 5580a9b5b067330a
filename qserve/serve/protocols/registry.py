"""The protocols this server speaks, in the order the route table holds their routes (and OpenAPI lists them).

    python -c "from qserve.serve.protocols.registry import PROTOCOLS; print([p.name for p in PROTOCOLS])"

Each is one module's declaration (spec.ProtocolSpec): the router's one route table, metrics, tracing and the
OpenAPI document derive everything from this tuple. Adding a protocol: one new module, one line
here.
"""

from __future__ import annotations

from qserve.serve.protocols import page, probes, tei, v1, vllm_api
from qserve.serve.protocols.v2.protocol import V2

PROTOCOLS = (
    probes.PROBES,
    v1.V1,
    V2,
    page.PAGE,
    tei.TEI,
    vllm_api.VLLM,
)

DEFAULT = v1.V1
"""A refused body on a route whose protocol says nothing of its own is told /v1's form."""
