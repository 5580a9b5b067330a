"""Training: the Fabric fine-tune, its batches, precisions, resumable checkpoints and the precision study.

    qserve train --max-samples 4000 --epochs 1          # embedded MiniLM-DistilBERT on embedded IMDb

Nothing here is imported by `import qserve`.
"""
