"""KServe V2 / the Open Inference Protocol, over HTTP and gRPC: one protocol, one package (protocol.py declares it).

python -c "from qserve.serve.protocols.v2.protocol import V2; print([(r.method, r.path) for r in V2.routes])"
"""
