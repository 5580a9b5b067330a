"""Compile, into the image, the bytecode of every module a serving start imports: run in the build stage.

    /opt/qserve/bin/python /pip/precompile.py

The image runs with a read-only root filesystem and PYTHONDONTWRITEBYTECODE, so a module without its .pyc is
compiled from source at every container start (fastapi, pydantic, numpy, uvicorn, qserve ...): most of start to
ready before this ran (benchmarks/reports/image/). Compiling all of site-packages would put the serving image over
its size bar, for modules a server never imports (transformers' model code, tests, pip); so this imports what
`qserve serve` imports (the CLI, the app, its uvicorn config and event loop, each backend's runtime this install can
serve, the tokenizer of a BERT-layout dir) and compiles every module Python compiled from source meanwhile.
Unchecked hash-based .pyc: the image is immutable, and neither the source's mtime (which image tools may reset) nor
a hash is checked at import. A module a start imports beyond these still works, compiled at import as before;
benchmarks/image_report.py counts them.
"""

import importlib
import importlib.machinery
import importlib.util
import json
import py_compile
import sys
import tempfile
from pathlib import Path

PREFIX = Path(sys.prefix).resolve()


def serving_path() -> None:
    """Import what a `qserve serve` start imports, without a model."""
    cli = importlib.import_module("qserve.cli")
    cli.build_parser("serve")
    config = importlib.import_module("qserve.serve.infra.config")
    repository = importlib.import_module("qserve.serve.core.repository")
    app = importlib.import_module("qserve.serve.app").create_app(
        config.ServeConfig(), repository=repository.Repository([])
    )
    uv = importlib.import_module("qserve.serve.infra.uvicorn_server").uvicorn_config(app, "127.0.0.1", 0)
    uv.load()
    uv.get_loop_factory() if hasattr(uv, "get_loop_factory") else uv.setup_event_loop()  # uvloop, as at a start
    runtime = importlib.import_module("qserve.runtime")
    extras = importlib.import_module("qserve.extras")
    variants = importlib.import_module("qserve.variants")
    for backend in variants.BACKENDS:
        entry = variants.REGISTRY[backend]
        if all(importlib.util.find_spec(m.split(".")[0]) for m in entry.needs):
            for module in entry.needs:
                extras.require(module, backend)
            runtime.runtime_class(backend)
    with tempfile.TemporaryDirectory() as d:  # the tokenizer load of a BERT-layout variant dir (the default's)
        tokenizers = importlib.import_module("tokenizers")
        vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])}
        tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(vocab, unk_token="[UNK]"))
        tok.save(f"{d}/tokenizer.json")
        Path(d, "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
        Path(d, "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}), encoding="utf-8")
        importlib.import_module("qserve.tokenization").load_tokenizer(d)


def main() -> int:
    # Every source Python compiles while importing: here no .pyc exists, so that is each module the serving path
    # loads, including those whose import then fails (an optional backend of a library).
    compiled = [getattr(m, "__file__", None) or "" for m in list(sys.modules.values())]  # site's (.pth) imports
    to_code = importlib.machinery.SourceFileLoader.source_to_code

    def recorded(self, data, path, *args, **kwargs):
        compiled.append(path)
        return to_code(self, data, path, *args, **kwargs)

    importlib.machinery.SourceFileLoader.source_to_code = recorded  # type: ignore[method-assign]
    serving_path()
    importlib.machinery.SourceFileLoader.source_to_code = to_code  # type: ignore[method-assign]
    done = 0
    for source in dict.fromkeys(compiled):
        if not source.endswith(".py") or not Path(source).resolve().is_relative_to(PREFIX):
            continue  # the base's own Python: its .pyc are the base image's (docker/Dockerfile compiles them)
        py_compile.compile(
            source,
            cfile=importlib.util.cache_from_source(source),
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        done += 1
    print(f"precompile: {done} modules of the serving path compiled", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
