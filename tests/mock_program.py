"""The program under Pulumi's mocks, in a process of its own (tests/program_harness.py
`run_program` starts it and reads the result after its @@RESULT@@ line): the stack config, the
mode (up or preview), the secret keys, the engine features to deny and a file of what the
nodes say (facts, ssh-keyscan, a prior state) on its command line; the repository on
PYTHONPATH, this folder first (Python puts a script's own folder there).

    mock_program.py CONFIG_JSON up|preview SECRET_KEYS_JSON WITHHELD_JSON NODES_SAY_FILE
"""
import asyncio
import hashlib
import json
import logging
import runpy
import string
import sys
import traceback

import pulumi
from program_harness import without_ignored
from pulumi.runtime import mocks as pm
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import wait_for_rpcs

config, preview, secret_keys = json.loads(sys.argv[1]), sys.argv[2] == "preview", json.loads(sys.argv[3])
withheld = {getattr(resource_pb2, name) for name in json.loads(sys.argv[4])}  # engine features to deny
# {"registry": str, "hub": str, "facts": {node: {fact: value}}, "keyscan": {host: key} | None, "prior": {...}}:
# a file (a prior state is large)
nodes_say = json.loads(open(sys.argv[5]).read())
if nodes_say["keyscan"] is not None:  # what each host shows ssh-keyscan; a host not named does not answer
    from core import host_keys
    def scan(host, port=22, timeout_s=10, key_type=host_keys.KEY_TYPE):
        if host not in nodes_say["keyscan"]:
            raise host_keys.HostKeyError(f"ssh-keyscan got no {key_type} key from {host} port {port}")
        return nodes_say["keyscan"][host]
    host_keys.scan = scan
records, exports, kept, given = [], {}, {}, {}

RECIPE_FACTS = {"os": "DGX OS 7.2.3", "kernel": "6.17.0-1029-nvidia", "driver": "580.173.02", "cuda": "13.0",
                "gpu": "NVIDIA GB10", "bios_version": "5.36_0ACUM030", "bios_date": "2026-05-20",
                "cma_total_kb": "0", "cma_free_kb": "0", "vllm": "0.25.2.dev0+g752a3a504", "torch": "2.11.0",
                "nccl": "2.30.7", "nccl_pip": None, "image_cuda": "13.0", "ray": "2.57.0"}

def node_answer(name, inputs):
    """What a simulated node prints for the steps whose stdout the program reads."""
    import shlex
    if name.endswith("image-pin-resolve"):  # serving.image's and each monitoring image's
        return "sha256:" + hashlib.sha256((nodes_say["registry"] + inputs["create"]).encode()).hexdigest()
    if name.endswith("-platform-facts"):
        argv = shlex.split(inputs["create"])
        node, image = (argv[argv.index(f) + 1] for f in ("--node", "--image"))
        base = argv[argv.index("--base") + 1] if "--base" in argv else None  # only where it was built
        facts = {**RECIPE_FACTS, "image": image, "image_base": base, **nodes_say["facts"].get(node, {})}
        return "ok\n" + json.dumps({"node": node, "facts": facts, "errors": {}})
    if name.endswith("-image-ship"):  # as ship-image.sh: the image ID the worker now holds
        argv = shlex.split(inputs["create"])
        return f"12:00:00 ship-image: loaded\n{argv[argv.index('--id') + 1]}\n"
    if "sync-key" in name:
        return "ssh-ed25519 AAAAC3NzaFAKEKEY twinspark-weights@" + name.rsplit("-", 1)[-1]
    if name.endswith("-weights-memory"):  # as model-shape-check.sh memory: a Spark's 121 GiB
        argv = shlex.split(inputs["create"])
        return f"memory-kb {argv[argv.index('--node') + 1]}={121 << 20}\n"
    if name.endswith("-weights-revision"):  # as fetch-weights.sh resolve: a log line, then the commit
        argv = shlex.split(inputs["create"])
        asked = argv[argv.index("--revision") + 1] if "--revision" in argv else ""
        repo = argv[argv.index("--repo") + 1]
        commit = asked or hashlib.sha1((nodes_say["hub"] + repo).encode()).hexdigest()  # the hub's head
        return f"12:00:00 fetch-weights: resolved: {repo}@{asked} is commit {commit}\n{commit}\n"
    return ""

def fake_outputs(type_, name, inputs):
    out = dict(inputs)
    if type_ == "docker:index/image:Image":
        out["repoDigest"] = "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    if type_ == "docker:index/remoteImage:RemoteImage":
        out["imageId"] = "sha256:" + hashlib.sha256(inputs["name"].encode()).hexdigest()
    if type_ == "random:index/randomPassword:RandomPassword":
        # as the provider generates it: the length asked for, letters and digits (special=False);
        # each secret its own value, the same on every run
        alphabet = string.ascii_letters + string.digits
        seed = hashlib.sha256(name.encode()).digest() * 8
        out["result"] = "".join(alphabet[b % len(alphabet)] for b in seed)[:int(inputs["length"])]
    if type_ == "random:index/randomId:RandomId":  # byte_length random bytes, the same on every run
        drawn = hashlib.sha256(name.encode()).digest()[:int(inputs["byteLength"])]
        out["hex"], out["dec"] = drawn.hex(), str(int.from_bytes(drawn, "big"))
    if type_ == "command:remote:Command":
        out["stdout"] = node_answer(name, inputs)
        out["stderr"] = ""
    return out

class Mocks(pm.Mocks):
    def new_resource(self, args):
        outputs = kept.pop(args.name, None) or fake_outputs(args.typ, args.name, args.inputs)
        given[args.name] = outputs
        return [args.name + "_id", outputs]
    def call(self, args):
        return {}

class RecordingMonitor(pm.MockMonitor):
    def GetDeploymentInfo(self, request):
        # an older engine: what it cannot do is missing from the features it reports
        info = super().GetDeploymentInfo(request)
        return resource_pb2.DeploymentInfo(supportedFeatures=[f for f in info.supportedFeatures if f not in withheld])

    def RegisterResource(self, request):
        from google.protobuf import json_format
        inputs = json_format.MessageToDict(request.object)
        before = nodes_say["prior"].get(request.name)
        now = without_ignored(inputs, list(request.ignoreChanges))
        if before is not None and before["compared"] == now:  # no diff: the state's outputs stay
            kept[request.name] = before["outputs"]
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            records.append({"urn": response.urn, "compared": now, "outputs": given.get(request.name, {}),
                "type": request.type, "name": request.name, "custom": request.custom,
                "parent": request.parent, "dependencies": list(request.dependencies),
                "provider": request.provider, "deleteBeforeReplace": request.deleteBeforeReplace,
                "replaceWith": list(request.replace_with),
                "ignoreChanges": list(request.ignoreChanges), "replaceOnChanges": list(request.replaceOnChanges),
                "inputs": inputs,
                "aliases": [json_format.MessageToDict(a) for a in request.aliases],
            })
        return response

mocks = Mocks()
# what the program says through pulumi.log at WARNING (the mock engine logs it to this logger)
warned = []
class Recording(logging.Handler):
    def emit(self, record):
        warned.append(record.getMessage())
engine_log = logging.getLogger("twinspark-engine")
engine_log.addHandler(Recording(logging.WARNING))
engine_log.propagate = False
pm.set_mocks(mocks, project="twinspark", stack="spark", preview=preview, monitor=RecordingMonitor(mocks),
             logger=engine_log)
pulumi.runtime.set_all_config(config, secret_keys)

def export(name, value):
    exports[name] = pulumi.Output.from_input(value)
pulumi.export = export

async def resolve():
    result = {}
    for name, out in exports.items():
        result[name] = {"value": await out.future(), "secret": await out.is_secret()}
    return result

loop = asyncio.get_event_loop()
error = None
try:
    runpy.run_path("__main__.py", run_name="__main__")
    outputs = loop.run_until_complete(resolve())
    loop.run_until_complete(wait_for_rpcs())
except pulumi.RunError as e:
    error, outputs = {"kind": "RunError", "message": str(e)}, {}
except Exception as e:
    error, outputs = {"kind": type(e).__name__, "message": traceback.format_exc()}, {}
if error is not None:
    # as the SDK does after a failed program (pulumi/runtime/stack.py, run_pulumi_func): what
    # was registered before the error still reaches the engine, so it is recorded here too
    try:
        loop.run_until_complete(wait_for_rpcs())
    except Exception:
        pass  # the failure already reported, seen again by an outstanding RPC
print("@@RESULT@@" + json.dumps({"resources": records, "outputs": outputs, "error": error, "warnings": warned},
                              default=str))
