"""Training examples and batches: a split encoded as training reads it, padded per batch, and evaluated.

    python -c "from qserve.training.batches import PadCollate; \\
print(PadCollate(0)([([101, 7, 102], 1), ([101, 102], 0)]))"

qserve/training/train.py's loop uses these for training, validation and test alike, so all three read a text
the same way: encode_split cuts it by the long-text policy (a pair as the tokenizer truncates it),
PadCollate pads each batch to its own longest sequence, and evaluate sums the metrics of
qserve.problemtypes exactly over DDP ranks.
"""

from __future__ import annotations

from typing import Any

from qserve.problemtypes import SINGLE, batch_sums, finish_sums, loss, target
from qserve.longtext import split_texts
from qserve.textpairs import split_pairs


class PadCollate:
    """Pad each batch to its own longest sequence (dynamic padding; order untouched)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, batch: list[tuple]) -> dict[str, Any]:
        import torch

        width = max(len(ex[0]) for ex in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, ex in enumerate(batch):
            input_ids[i, : len(ex[0])] = torch.tensor(ex[0], dtype=torch.long)
            mask[i, : len(ex[0])] = 1
        out = {"input_ids": input_ids, "attention_mask": mask,
               "labels": torch.tensor([ex[1] for ex in batch],  # class ids, multi-hot rows or [value]
                                      dtype=torch.long if isinstance(batch[0][1], int) else torch.float32)}
        if len(batch[0]) > 2:  # text pairs: (ids, target, token_type_ids), the second segment 1
            types = torch.zeros_like(input_ids)
            for i, ex in enumerate(batch):
                types[i, : len(ex[2])] = torch.tensor(ex[2], dtype=torch.long)
            out["token_type_ids"] = types
        return out


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


def evaluate(fabric, model, examples: list[tuple[list[int], Any]], batch_size: int, pad_id: int,
             problem: str = SINGLE) -> dict[str, float]:
    """Metrics (qserve.problemtypes.finish_sums) and mean loss over `examples`, sharded over ranks and summed exactly.

    Each rank gets the same number of batches (short shards are padded with weight-0
    examples), so DDP ranks never wait on each other and nothing is counted twice.
    """
    import torch

    ws, rank = fabric.world_size, fabric.global_rank
    idx = list(range(rank, len(examples), ws))
    per_rank = -(-len(examples) // ws)
    weights = [1.0] * len(idx) + [0.0] * (per_rank - len(idx))
    idx += [0] * (per_rank - len(idx))
    collate = PadCollate(pad_id)
    sums: dict[str, Any] = {}
    loss_sum = torch.zeros((), dtype=torch.float64, device=fabric.device)
    model.eval()
    with torch.no_grad():
        for start in range(0, per_rank, batch_size):
            chunk = idx[start:start + batch_size]
            batch = fabric.to_device(collate([examples[i] for i in chunk]))
            w = torch.tensor(weights[start:start + batch_size], dtype=torch.float64, device=fabric.device)
            logits = model(**batch_inputs(batch)).logits.float()
            loss_sum += (loss(logits, batch["labels"], problem, reduction="none").double() * w).sum()
            for key, per in batch_sums(logits, batch["labels"], problem).items():
                sums[key] = sums.get(key, 0) + (per * w).sum()
    totals = {k: float(fabric.all_reduce(v, reduce_op="sum")) for k, v in sums.items()}
    return finish_sums(totals, float(fabric.all_reduce(loss_sum, reduce_op="sum")), len(examples), problem)
