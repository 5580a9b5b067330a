"""The optional libraries qserve imports on use: which extra installs each, and the one way to import one.

    python -c "from qserve.extras import install_hint; print(install_hint('openvino'), install_hint('ray'))"

A backend's libraries are its registry entry's (`Backend.needs`, `Backend.install`); the other extras' are EXTRAS.
`require(module, needed_by)` imports one or raises the QserveError naming what needed it and the install command,
so a missing optional library fails only the command that needs it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from qserve import QserveError
from qserve.variants import REGISTRY

EXTRAS = {
    "ray": "pip install 'qserve[ray]'  (installs ray[serve]==2.60.0)",
    "pyarrow": "pip install 'qserve[predict]'",
    "opentelemetry": "pip install 'qserve[otel]'",
    "grpc": "pip install 'qserve[grpc]'",
    "tritonclient": "pip install 'qserve[grpc]'",
    "datasets": "pip install 'qserve[hub]' (the `datasets` package); a hub id needs network access to huggingface.co",
}
"""Library (import name) -> the command that installs it, for the optional libraries of no backend."""
TOOLKIT = "pip install 'qserve[toolkit]'"
"""What installs an exporter's libraries (train, export, bench, gate): a serving install has none of them."""
# The import names a serving install (`pip install 'qserve[serve]'`, the serve image) has none of: every exporter's,
# the runtimes' of the backends it does not serve (Backend.serving), training's. The image's build and test check each.
_LACKS = [m for b in REGISTRY.values() for m in (() if b.serving else b.needs) + b.export_needs]
TOOLKIT_ONLY = (*dict.fromkeys(_LACKS), "lightning_fabric")


def install_hint(module: str) -> str:
    """The command that installs `module`'s library: its backend's (the registry), else its extra's."""
    top = module.split(".")[0]
    hints = [b.install if top in b.needs else TOOLKIT for b in REGISTRY.values() if top in b.needs + b.export_needs]
    return hints[0] if hints else EXTRAS[top]


def require(module: str, needed_by: str) -> ModuleType:
    """Import `module` (an optional library's) for `needed_by`; missing, a QserveError says what needs it and how
    to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise QserveError(
            f"{needed_by} needs {module.split('.')[0]}, which is not installed here ({e}); install it "
            f"with: {install_hint(module)}"
        ) from e
