"""Data: the datasets a model trains and is evaluated on.

    python -c "from qserve.data.datasets import load_dataset; d = load_dataset(); print(d.info['sizes'])"

datasets.py (the embedded IMDb / Rotten Tomatoes, a hub id or a local file, split and cleaned) and
local.py (a local .csv/.jsonl/.json file read and checked row by row). Nothing here is imported by
`import qserve`.
"""
