"""The docs' rendering: what `make reports` runs and how the measured numbers reach README.md and docs/.

    python -m benchmarks.render.rebuild            # `make reports`: list the stages, or run one (STAGE=name)
    python -m benchmarks.render.tables --check     # the measured blocks against their reports' JSON

stages        the stages of `make reports` (data): commands, the reports each writes, their renderers
rebuild       runs a stage on the CPU that measured its reports, records its time, re-renders the docs
tables        writes the blocks between the docs' markers, and finds numbers typed by hand in prose
blocks/       one function per block, one module per area of the docs, reading reports from benchmarks/reports/
byo_matrix    docs/byo-matrix.md, from what tests/integration/test_byo_matrix.py observed
"""
