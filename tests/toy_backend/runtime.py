"""The toy backend's runtime: the saved model run eagerly by transformers on the CPU."""

from __future__ import annotations

import numpy as np

from qserve.modeling import model_inputs
from qserve.runtime.base import Runtime


class ToyRuntime(Runtime):
    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        self.model = AutoModelForSequenceClassification.from_pretrained(self.variant_dir).eval()
        self.takes = set(model_inputs(self.model))

    def forward(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            feed = {k: torch.from_numpy(v) for k, v in batch.items() if k in self.takes}
            return self.model(**feed).logits.float().numpy()
