"""Runtime for torch and bitsandbytes variants (both are HF checkpoints on disk).

    python -c "from qserve.runtime import load_runtime; print(load_runtime('models/minilm-imdb-variants/torch-bf16').predict(['fine']))"
"""

from __future__ import annotations

import numpy as np

from qserve.runtime.base import Runtime


class TorchRuntime(Runtime):
    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        spec = self.manifest["spec"]
        kwargs = {}
        if spec["backend"] == "bnb":
            from qserve import QserveError

            try:
                import bitsandbytes  # noqa: F401
            except ImportError as e:
                raise QserveError(f"{self.name} needs bitsandbytes: pip install bitsandbytes==0.50.2 ({e})") from e
            # The quantization config is stored in config.json; weights load already quantized.
            kwargs["device_map"] = {"": self.device}
        else:
            kwargs["dtype"] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[spec["dtype"]]
        self.model = AutoModelForSequenceClassification.from_pretrained(self.variant_dir, **kwargs).eval()
        if spec["backend"] == "torch":
            self.model.to(self.device)
        self._torch = torch

    def forward(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        torch = self._torch
        feed = {k: torch.from_numpy(v).to(self.device) for k, v in batch.items()}
        with torch.inference_mode():
            logits = self.model(**feed).logits
        return logits.float().cpu().numpy()

    def synchronize(self) -> None:
        if self.device.startswith("cuda"):
            self._torch.cuda.synchronize()

    def close(self) -> None:
        self.model = None
