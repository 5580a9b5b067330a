"""Data: the datasets a model trains and is evaluated on (datasets.py; a local file: local.py).

    python -c "from qserve.data.datasets import load_dataset; d = load_dataset(); print(d.info['sizes'])"

Nothing here is imported by `import qserve`.
"""
