"""The edge agent: the data plane of one edge box.

It serves a model repository over the Open Inference Protocol (grpc_api,
http_api), batches requests per model (batcher), keeps the model table
(models), and runs ONNX Runtime sessions in runner processes forked from a
zygote (zygote, runner, runners). docs/architecture.md walks one request
through these modules.
"""
