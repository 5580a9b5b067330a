"""Runtime for torch and bitsandbytes variants (both are HF checkpoints on disk).

    python -c "from qserve.runtime import load_runtime; \\
print(load_runtime('models/minilm-imdb-variants/torch-bf16').predict(['fine']))"
"""

from __future__ import annotations

import logging

import json
import numpy as np
import copy

from qserve.devices import capabilities
from qserve.runtime.base import Runtime
from qserve.variants import REGISTRY, VariantSpec, option_defaults
from qserve import QserveError
from qserve.extras import require
from qserve.artifact import VariantError
from qserve.modeling import model_inputs


class TorchRuntime(Runtime):
    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        spec = self.manifest.spec
        kwargs = {}
        if spec.backend == "bnb":
            kwargs = _bnb_load_kwargs(self.variant_dir, self.name, self.device)
        else:
            kwargs["dtype"] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[spec.dtype]
        self.model = AutoModelForSequenceClassification.from_pretrained(self.variant_dir, **kwargs).eval()
        if spec.backend == "torch":
            self.model.to(self.device)
            if spec.dtype == "bf16" and not self.device.startswith("cuda") and \
                    capabilities(with_cuda=False).has("bf16") is False:
                # Emulated bf16 GEMMs round partial sums in an order set by the batch's shape, so a row's answer
                # moves with its batchmates (labels flip): without native bf16, each text runs alone.
                self.batch_invariant = False
        else:
            _bnb_prepare(self.model, self.device)
            self.batch_invariant = not _llm_int8_picks_outliers_per_batch(self.model, spec, self.device)
        self._torch = torch

        self.input_names = model_inputs(self.model)

    def forward(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        torch = self._torch
        # The model's own inputs decide: token_type_ids reach BERT-layout models, not DistilBERT or ModernBERT.
        feed = {k: torch.from_numpy(v).to(self.device) for k, v in batch.items() if k in self.input_names}
        with torch.inference_mode():
            logits = self.model(**feed).logits
        return logits.float().cpu().numpy()

    def synchronize(self) -> None:
        if self.device.startswith("cuda"):
            self._torch.cuda.synchronize()

    def close(self) -> None:
        self.model = None


# -- bitsandbytes ---------------------------------------------------------------------

def _llm_int8_picks_outliers_per_batch(model, spec: VariantSpec, device: str) -> bool:
    """LLM.int8 computes in 16-bit every input column where any row of the batch exceeds the threshold,
    so a row's result depends on its batchmates (the runtime then runs rows alone); threshold 0 turns
    that outlier path off."""
    if spec.dtype != "int8":
        return False
    qc = getattr(model.config, "quantization_config", None)
    unset = option_defaults("bnb-int8")["llm_int8_threshold"]  # the registry's default, which the exporter writes
    threshold = qc.get("llm_int8_threshold", unset) if isinstance(qc, dict) else getattr(qc, "llm_int8_threshold", unset)
    return float(threshold or 0.0) > 0.0


def _bnb_load_kwargs(variant_dir, name: str, device: str) -> dict:
    """from_pretrained kwargs for a bnb variant: its config.json carries the quantization_config,
    and the safetensors hold the already-quantized weights, so no source checkpoint is needed."""
    for module in REGISTRY["bnb"].needs:
        require(module, name)
    cfg = json.loads((variant_dir / "config.json").read_text(encoding="utf-8"))
    if (cfg.get("quantization_config") or {}).get("quant_method") != "bitsandbytes":
        # Without it transformers would silently load the tensors as a plain model.
        raise VariantError(f"{variant_dir}/config.json has no bitsandbytes quantization_config; "
                           "the variant is damaged or not a bnb export, re-run `qserve export`")
    # LLM.int8 quantizes activations from fp16 by design, and bitsandbytes logs that at WARNING
    # on every int8 matmul (12 lines per request for a 6-layer model): drop just that message.
    bnb_log = logging.getLogger("bitsandbytes.autograd._functions")
    if not any(isinstance(f, _DropInt8CastWarning) for f in bnb_log.filters):
        bnb_log.addFilter(_DropInt8CastWarning())
    # dtype "auto" = the dtype config.json records for the unquantized modules (fp32 from our
    # exporter); without it transformers' bnb loader would cast them to fp16.
    return {"device_map": {"": device}, "dtype": "auto"}


class _DropInt8CastWarning:
    def filter(self, record) -> bool:
        return not str(record.msg).startswith("MatMul8bitLt: inputs will be cast")


def _bnb_prepare(model, device: str) -> None:
    """Work around two bitsandbytes 0.50.2 CPU limits for 4-bit layers of narrow shapes.

    1. It repacks Linear4bit weights for its AVX512-BF16 kernel on the first forward, which
       needs out_features % 32 == 0 and in_features % blocksize == 0; other shapes crash
       there ("shape '[32, 0]' is invalid"). Those go to the generic path.
    2. The generic CPU dequantize blocks each row on its own, while the quantizer's blocks
       run over the flattened weight: when in_features % blocksize != 0 it computes with
       wrong weights. Those layers get a forward that dequantizes the stored blocks in their
       own (flat) layout.
    Real encoders (dim 384/768, FFN 1536/3072) fit both; the tests' tiny models do not.
    """
    if not device.startswith("cpu"):
        return
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            if hasattr(module, "support_avx512bf16_for_cpu") and (
                    module.out_features % 32 or module.in_features % state.blocksize):
                module.support_avx512bf16_for_cpu = False
            if module.in_features % state.blocksize:
                module.forward = _flat_dequantized_forward(module)


def _flat_dequantized_forward(module):
    """A Linear4bit forward that dequantizes the weight as stored (flat blocks), then runs a plain linear."""
    import bitsandbytes.functional as F
    import torch

    state = copy.copy(module.weight.quant_state)
    shape = state.shape
    state.shape = torch.Size([shape.numel()])

    def forward(x):
        dtype = module.compute_dtype or x.dtype
        w = F.dequantize_4bit(module.weight.data.reshape(-1), state).reshape(shape).to(dtype)
        bias = None if module.bias is None else module.bias.to(dtype)
        return torch.nn.functional.linear(x.to(dtype), w, bias).to(x.dtype)

    return forward
