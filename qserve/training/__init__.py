"""Training: the Fabric fine-tune, its batches, precisions, resumable checkpoints and the precision study.

    qserve train --max-samples 4000 --epochs 1          # embedded MiniLM-DistilBERT on embedded IMDb

train.py (the loop, `qserve train`, `python -m qserve.training.train`), config.py (TrainConfig: what one
fine-tune is, its checks and derived seeds), batches.py (a split encoded,
padded per batch and evaluated), precision.py (what each precision needs: device checks, optimizer,
memory), outputs.py (train_metrics.json and the checkpoint directory a finished run writes), resume.py
(the resumable checkpoint and what a re-run does with it) and study.py (`qserve train --compare`: one
child run per precision). Nothing here is imported by `import qserve`.
"""
