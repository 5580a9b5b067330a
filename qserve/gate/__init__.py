"""The release gate: a variant serves only after it proves itself against fp32 on labelled data (`qserve gate`).

    qserve gate models/minilm-l6-distilbert-imdb/variants/onnx-int8 --out benchmarks/reports/gate

stats.py (intervals, ECE, the calibration fits), config.py (the flags and the bars), run.py (score, judge,
calibrate, seal into the manifest), report.py (gate.md, gate.json, gate.png), cli.py (the command). docs/gate.md.
"""
