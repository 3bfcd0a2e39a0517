"""Triton's own Python client examples, run unmodified against edgeplex.

    python bench/triton_examples.py --client PATH [--only NAME,...] [--json out.json]

PATH is a checkout of triton-inference-server/client (its examples are read from
`src/python/examples` there and never copied here). This builds ONNX equivalents
of the example models (same names, tensors, types and shapes) in a temporary
Triton repository, with the repository Triton's examples count on (eight model
folders: the sequence and decoupled models it cannot serve are listed as
unavailable), starts two agents, one in the default model-control mode and one
in `explicit` mode for the scripts that load and unload models, runs each
script with `-u` pointing at the agent, and reports which pass.

The image scripts (image_client.py, grpc_image_client.py, grpc_client.py) run
against a third agent serving `densenet_onnx` as Triton's quick start configures
it (an input reshaped from [3, 224, 224] to the graph's [1, 3, 224, 224], NCHW,
an output of 1,000 classes reshaped from [1, 1000, 1, 1], a label file), with a
small graph of the same interface in place of DenseNet's weights, classifying a
generated image (`-c 3 -s INCEPTION`). Scripts that need what a CPU build has not
(CUDA shared memory), the image preprocessing ensemble, or cannot be pointed at
another address are listed as not run, with why; checks that the server calls
itself Triton are expected to fail. `--python` runs the examples with another
interpreter, so a tritonclient release can be tried in a virtual environment of
its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Agent

NOT_RUN = {
    "memory_growth_test.py": "has no --url option: it only reaches localhost:8000",
    "ensemble_image_client.py": "needs the image preprocessing ensemble (DALI or Python)",
    "simple_grpc_cudashm_client.py": "CUDA shared memory: a GPU build only",
    "simple_http_cudashm_client.py": "CUDA shared memory: a GPU build only",
}
CONTROL = ("simple_grpc_model_control.py", "simple_http_model_control.py")
IMAGES = ("image_client.py", "grpc_image_client.py", "grpc_client.py")
DENSENET = """name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""  # Triton's quick start configuration of the model, as it is
# Checks edgeplex does not pass on purpose (the Goal leaves them out): the server's
# name is edgeplex, not triton.
CALLS_ITSELF_TRITON = ("simple_grpc_health_metadata.py", "simple_http_health_metadata.py")


def _config(name: str, datatype: str, dims: str = "16", max_batch: int = 8) -> str:
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_{datatype} dims: [ {dims} ] }},\n'
        f'        {{ name: "INPUT1" data_type: TYPE_{datatype} dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_{datatype} dims: [ {dims} ] }},\n'
        f'         {{ name: "OUTPUT1" data_type: TYPE_{datatype} dims: [ {dims} ] }} ]\n'
    )


def build_repository(repo: Path, folders: int = 8) -> None:
    """ONNX equivalents of Triton's example models, and folders standing for the ones
    ONNX cannot stand in for here (a custom backend's, a decoupled one):
    `folders` in all (Triton's gRPC model-control example counts 8, its HTTP one 7)."""
    from onnx import TensorProto, helper, save

    def add_sub(name: str, elem: int, datatype: str, strings: bool = False) -> None:
        def value(n: str):  # type: ignore[no-untyped-def]
            return helper.make_tensor_value_info(n, elem, ["batch", 16])

        nodes = []
        a, b = "INPUT0", "INPUT1"
        if strings:  # the sum and difference of numbers written as text, as Triton's
            nodes += [
                helper.make_node("Cast", [given], [to], to=TensorProto.INT32)
                for given, to in (("INPUT0", "a"), ("INPUT1", "b"))
            ]
            a, b = "a", "b"
        sums = ("s", "d") if strings else ("OUTPUT0", "OUTPUT1")
        nodes += [helper.make_node("Add", [a, b], [sums[0]]),
                  helper.make_node("Sub", [a, b], [sums[1]])]  # fmt: skip
        if strings:
            nodes += [
                helper.make_node("Cast", [given], [to], to=TensorProto.STRING)
                for given, to in (("s", "OUTPUT0"), ("d", "OUTPUT1"))
            ]
        graph = helper.make_graph(
            nodes, name, [value("INPUT0"), value("INPUT1")], [value("OUTPUT0"), value("OUTPUT1")]
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        (repo / name / "1").mkdir(parents=True)
        save(model, str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.pbtxt").write_text(_config(name, datatype))

    def identity(name: str, elem: int, datatype: str) -> None:
        spec = [
            helper.make_tensor_value_info(n, elem, ["batch", "n"]) for n in ("INPUT0", "OUTPUT0")
        ]
        graph = helper.make_graph(
            [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], name, spec[:1], spec[1:]
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        (repo / name / "1").mkdir(parents=True)
        save(model, str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            f'input [ {{ name: "INPUT0" data_type: TYPE_{datatype} dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_{datatype} dims: [ -1 ] }} ]\n'
        )

    def simple_sequence() -> None:  # OUTPUT = (INPUT + START) * READY, as Triton's answers
        names = ("INPUT", "START", "READY", "OUTPUT")
        spec = {n: helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1]) for n in names}
        nodes = [helper.make_node("Add", ["INPUT", "START"], ["sum"]),
                 helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"])]  # fmt: skip
        graph = helper.make_graph(nodes, "simple_sequence", [spec[n] for n in names[:3]],
                                  [spec["OUTPUT"]])  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        (repo / "simple_sequence" / "1").mkdir(parents=True)
        save(model, str(repo / "simple_sequence" / "1" / "model.onnx"))
        flag = "control [ {{ kind: CONTROL_SEQUENCE_{} int32_false_true: [0, 1] }} ]"
        (repo / "simple_sequence" / "config.pbtxt").write_text(
            'name: "simple_sequence"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            f'sequence_batching {{ control_input [ {{ name: "START" {flag.format("START")} }},\n'
            f'  {{ name: "READY" {flag.format("READY")} }} ] }}\n'
        )

    simple_sequence()
    add_sub("simple", TensorProto.INT32, "INT32")
    add_sub("simple_int8", TensorProto.INT8, "INT8")
    add_sub("simple_string", TensorProto.STRING, "STRING", strings=True)
    identity("simple_identity", TensorProto.STRING, "STRING")
    identity("custom_identity_int32", TensorProto.INT32, "INT32")
    unservable = (
        ("simple_dyna_sequence", "sequence_batching"),
        ("repeat_int32", "decoupled"),
    )
    for name, why in unservable[: folders - 6]:  # fmt: skip
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "{why}"\n')


def build_densenet(repo: Path) -> Path:
    """`densenet_onnx` with the interface of Triton's quick start model and a small graph
    in place of DenseNet's (each channel's mean, times fixed weights, as 1,000 class
    scores), its labels, and an image to classify: the image's path."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    weights = np.random.default_rng(0).standard_normal((3, 1000)).astype(np.float32)
    nodes = [
        helper.make_node("GlobalAveragePool", ["data_0"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["means"]),
        helper.make_node("MatMul", ["means", "weights"], ["scores"]),
        helper.make_node("Reshape", ["scores", "shape"], ["fc6_1"]),
    ]
    graph = helper.make_graph(
        nodes,
        "densenet_onnx",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 1000, 1, 1])],
        [numpy_helper.from_array(weights, "weights"),
         numpy_helper.from_array(np.array([1, 1000, 1, 1], np.int64), "shape")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = repo / "densenet_onnx"
    (folder / "1").mkdir(parents=True)
    save(model, str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(DENSENET)
    (folder / "densenet_labels.txt").write_text("".join(f"CLASS_{i}\n" for i in range(1000)))
    pixels = np.random.default_rng(1).integers(0, 256, (96, 128, 3), np.uint8)
    image = repo.parent / "image.ppm"  # binary PPM: PIL reads it, nothing writes it but this
    image.write_bytes(b"P6\n128 96\n255\n" + pixels.tobytes())
    return image


def run_script(script: Path, python: str, args: list[str], timeout: float) -> tuple[bool, str]:
    started = time.monotonic()
    try:
        done = subprocess.run([python, str(script), *args], capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    said = (done.stdout + done.stderr).strip().splitlines()
    last = said[-1][:160] if said else ""
    return done.returncode == 0, f"{last} ({time.monotonic() - started:.1f} s)"


def runs(script: Path, agents: dict[str, Agent], image: Path) -> list[tuple[str, list[str]]]:
    """How a script is run: (label, arguments), once per protocol it takes."""
    agent, extra = agents["default"], []
    if script.name in CONTROL:
        agent = agents["explicit-http" if "http" in script.name else "explicit"]
    if script.name in IMAGES:
        agent = agents["images"]
        if script.name != "grpc_client.py":  # it names its model and sends no image
            extra = ["-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION", str(image)]
    if "--protocol" in script.read_text():  # either protocol, by -i
        return [(f"{script.name} -i http", ["-i", "http", "-u", agent.http, *extra]),
                (f"{script.name} -i grpc", ["-i", "grpc", "-u", agent.grpc, *extra])]  # fmt: skip
    url = agent.grpc if "grpc" in script.name else agent.http
    return [(script.name, ["-u", url, *extra])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", type=Path, required=True)
    parser.add_argument("--only", default="")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the Python that runs the examples: one with the tritonclient release to try "
        "(a virtual environment of its own: tritonclient 2.73 pins protobuf below 7)",
    )
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    examples = args.client / "src" / "python" / "examples"
    scripts = sorted(p for p in examples.glob("*.py"))
    if args.only:
        scripts = [p for p in scripts if p.name in args.only.split(",")]
    repo = Path(tempfile.mkdtemp(prefix="edgeplex-triton-examples-"))
    build_repository(repo / "eight")
    build_repository(repo / "seven", folders=7)
    image = build_densenet(repo / "images")
    control = {"model_control_mode": "explicit", "load_model": '["*"]'}
    agents = {
        "default": Agent(repo / "eight"),
        "explicit": Agent(repo / "eight", **control),
        "explicit-http": Agent(repo / "seven", **control),
        "images": Agent(repo / "images"),
    }
    rows = []
    try:
        for script in scripts:
            if script.name in NOT_RUN:
                rows.append(
                    {"script": script.name, "outcome": "not run", "why": NOT_RUN[script.name]}
                )
                continue
            for label, script_args in runs(script, agents, image):
                passed, why = run_script(script, args.python, script_args, args.timeout)
                outcome = "pass" if passed else "fail"
                if not passed and script.name in CALLS_ITSELF_TRITON:
                    outcome, why = "fail (expected)", f"checks the server is called triton; {why}"
                rows.append({"script": label, "outcome": outcome, "why": why})
                print(f"{outcome.upper():<15} {label:<50} {why}", flush=True)
    finally:
        for agent in agents.values():
            agent.stop()
    ran = [r for r in rows if r["outcome"] not in ("not run", "fail (expected)")]
    passed = sum(r["outcome"] == "pass" for r in ran)
    command = "python bench/triton_examples.py " + " ".join(sys.argv[1:])
    print(f"# {passed} of {len(ran)} runs pass; {len(rows) - len(ran)} not run or expected "
          f"to fail ({command})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
