#!/usr/bin/env python3
"""guard-tool-call.py GUARD BASE — the guard's own tool-call check (serving-guard.py's
streamed_tool_call, unchanged) against a real vLLM, once as it is (dummy weights: no call comes
back, the check must fail) and once with the model's text forced to a call by structured outputs
(tool-call-requests.py's regex, added to the guard's request body): the real parser's stream must
then pass. Prints one verdict line each. Standard library only (the device's python3)."""

import importlib.util
import json
import sys
from pathlib import Path



def load(name: str, path):
    """A script with a dash in its name, as a module (registered first: its dataclasses need it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


requests = load("tool_call_requests", Path(__file__).with_name("tool-call-requests.py"))


def main(guard_path: str, base: str) -> None:
    guard = load("serving_guard", guard_path)
    plain = guard.Api(base, "/dev/null", 60.0, key="unchecked")  # the forwarder checks no key

    class ForcedApi(guard.Api):
        def _request(self, path, body=None, timeout=None):
            if body and body.get("tools"):
                body = {**body, "structured_outputs": {"regex": requests.literal_regex(requests.FORCED_CALL)}}
                print(f"forced body: {json.dumps(body)}")
            return super()._request(path, body, timeout)

    for name, api in (("as the guard sends it", plain),
                      ("forced to a call", ForcedApi(base, "/dev/null", 60.0, key="unchecked"))):
        try:
            guard.streamed_tool_call(api, "tiny", "hermes")
            print(f"{name}: streamed_tool_call passed")
        except guard.CanaryFailure as failure:
            print(f"{name}: streamed_tool_call failed ({failure.kind}): {failure}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
