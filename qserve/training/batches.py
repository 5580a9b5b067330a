"""Training examples and batches: a split encoded as training reads it, padded per batch, and evaluated.

    python -c "from qserve.training.batches import TokenTable; \\
print(TokenTable([([101, 7, 102], 1), ([101, 102], 0)], 0).batch([1, 0]))"

Training, validation and test read a text the same way (encode_split, by the long-text policy); evaluate sums
the metrics exactly over DDP ranks.
"""

from __future__ import annotations

from typing import Any

from qserve.longtext import split_texts
from qserve.problemtypes import SINGLE, batch_sums, finish_sums, loss, target
from qserve.textpairs import split_pairs


class TokenTable:
    """A split's encoded examples as padded tensors, built once per run; a batch is its rows gathered and cut to their
    own longest sequence. Also the DataLoader's dataset (an item is its index) and collate_fn."""

    def __init__(self, examples: list[tuple], pad_id: int):
        import torch

        n = len(examples)
        self.lengths = torch.tensor([len(ex[0]) for ex in examples], dtype=torch.long)
        width = int(self.lengths.max()) if n else 0
        # int32 on the host (half of int64's memory for a long corpus); widened per batch
        self.ids = torch.full((n, width), pad_id, dtype=torch.int32)
        self.types = torch.zeros((n, width), dtype=torch.int32) if n and len(examples[0]) > 2 else None
        for i, ex in enumerate(examples):
            self.ids[i, : len(ex[0])] = torch.tensor(ex[0], dtype=torch.int32)
            if self.types is not None:
                self.types[i, : len(ex[2])] = torch.tensor(ex[2], dtype=torch.int32)
        # class ids, multi-hot rows or [value]
        kind = torch.long if n and isinstance(examples[0][1], int) else torch.float32
        self.targets = torch.tensor([ex[1] for ex in examples], dtype=kind)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> int:
        return i

    def batch(self, indices: list[int], pin: bool = False) -> dict[str, Any]:
        """input_ids, attention_mask, labels (and token_type_ids for pairs) of these rows, padded to their longest;
        pin: in page-locked memory, so the copy to the GPU is asynchronous."""
        import torch

        idx = torch.as_tensor(indices, dtype=torch.long)
        lengths = self.lengths.index_select(0, idx)
        width = int(lengths.max()) if len(idx) else 0
        # index_select, then the slice: an advanced index with a slice (ids[idx, :w]) is many times slower
        out = {
            "input_ids": self.ids.index_select(0, idx)[:, :width].long(),
            "attention_mask": (torch.arange(width) < lengths[:, None]).long(),
            "labels": self.targets.index_select(0, idx),
        }
        if self.types is not None:  # text pairs: the second segment 1
            out["token_type_ids"] = self.types.index_select(0, idx)[:, :width].long()
        return {k: v.pin_memory() for k, v in out.items()} if pin else out

    __call__ = batch  # the DataLoader's collate_fn (pinning, on CUDA, is the DataLoader's own)


def batch_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The model's inputs of a collated batch (token_type_ids only for pairs, whose tokenizer makes them)."""
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}


def encode_split(tok, split, max_length: int, policy: str, problem: str, k: int) -> list[tuple]:
    """(ids, target) per text, cut by the long-text policy exactly as export, bench and serve cut it; for a
    pair split (ids, target, token_type_ids) per pair, as the tokenizer encodes and truncates it (textpairs.py)."""
    targets = [target(lab, problem, k) for lab in split.labels]
    if split.pairs is not None:
        pieces = split_pairs(tok, split.texts, split.pairs, max_length)
        if pieces.types is not None:
            return list(zip(pieces.ids, targets, pieces.types))
        return list(zip(pieces.ids, targets))
    return list(zip(split_texts(tok, split.texts, policy, max_length).ids, targets))


def evaluate(fabric, model, examples: TokenTable, batch_size: int, problem: str = SINGLE) -> dict[str, float]:
    """Metrics (problemtypes.finish_sums) and mean loss over `examples`, sharded over ranks (short shards padded with
    weight-0 examples, so no rank waits) and summed exactly."""
    import torch

    ws, rank = fabric.world_size, fabric.global_rank
    idx = list(range(rank, len(examples), ws))
    per_rank = -(-len(examples) // ws)
    weights = [1.0] * len(idx) + [0.0] * (per_rank - len(idx))
    idx += [0] * (per_rank - len(idx))
    pin = fabric.device.type == "cuda"
    sums: dict[str, Any] = {}
    loss_sum = torch.zeros((), dtype=torch.float64, device=fabric.device)
    model.eval()
    with torch.no_grad():
        for start in range(0, per_rank, batch_size):
            chunk = idx[start : start + batch_size]
            batch = fabric.to_device(examples.batch(chunk, pin=pin))
            w = torch.tensor(weights[start : start + batch_size], dtype=torch.float64, device=fabric.device)
            logits = model(**batch_inputs(batch)).logits.float()
            loss_sum += (loss(logits, batch["labels"], problem, reduction="none").double() * w).sum()
            for key, per in batch_sums(logits, batch["labels"], problem).items():
                sums[key] = sums.get(key, 0) + (per * w).sum()
    totals = {k: float(fabric.all_reduce(v, reduce_op="sum")) for k, v in sums.items()}
    return finish_sums(totals, float(fabric.all_reduce(loss_sum, reduce_op="sum")), len(examples), problem)
