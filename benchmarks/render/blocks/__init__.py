"""The blocks benchmarks/render/tables.py writes into README.md and docs/: one function per block, one module per
area of the docs, every one reading the committed reports through reports.load.

    python -c "from benchmarks.render.blocks import serving; print(serving.flood())"

reports       where the committed reports are, the one loader every block reads them with (a test that points
              REPORTS elsewhere reaches every block), and how a block names its report and the CPU it records
cells         how a number is written in a cell or a sentence (a table, a percentage, a ratio, a range)
pipelines     the main job and the pipeline runs per machine: every variant, the training, what is recommended
long_text     the long-text policies per checkpoint, what the main job serves, windows served
training      the precision study, the seed's figures, the automatic precision's probe, optimizer steps,
              checkpoints' cost
serving       what serving costs beyond the model: overhead, batching, protocols, lanes, length buckets, flood,
              lifecycle, Ray Serve's sizing, and corpus scoring through the same runtime
int8          onnx-int8: its speed against the int8 floor, its smoothing, one text one answer (the candidates)
openvino      the OpenVINO variants against onnx-int8 and the int8 floor, the bf16 hint, their invariance
other_models  models other than the embedded sentiment classifier: multi-label checkpoints through the release
              gate, a BertForSequenceClassification brought as it is
bench         how the measurements are made and trusted: the `make reports` stages, the bench's eval cut,
              qserve bench against plain loops

A table renders its rows and the line naming its JSON (reports.rendered_from); a prose block quotes one report
(or a few of one run), names its machine (reports.on), and says nothing the JSON does not hold; the hand-written
text around a block says why the measurement was made and what it means. Register a new block in
tables.TABLES under the name its markers use.
"""
