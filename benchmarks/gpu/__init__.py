"""The GPU check, `bash benchmarks/gpu/check.sh A|B` (docs/gpu.md), its packer wheels.sh and its Python parts."""
