"""The protocols this server speaks, in the order their routes are registered (and listed in OpenAPI).

    python -c "from qserve.serve.protocols.registry import PROTOCOLS; print([p.name for p in PROTOCOLS])"

Each is one module's declaration (spec.ProtocolSpec): the app, the guard's route table, metrics,
tracing and the OpenAPI document derive everything from this tuple. Adding a protocol: one new module, one line
here.
"""

from __future__ import annotations

from qserve.serve.protocols import page, probes, tei, v1, vllm_api
from qserve.serve.protocols.spec import Protocols
from qserve.serve.protocols.v2.protocol import V2

PROTOCOLS = (
    probes.PROBES,
    v1.V1,
    V2,
    page.PAGE,
    tei.TEI,
    vllm_api.VLLM,
)

# /v1 is the default: a refused body on a route whose protocol says nothing of its own is told /v1's form
SERVED = Protocols(PROTOCOLS, default=v1.V1)
