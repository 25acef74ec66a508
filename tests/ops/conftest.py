"""The stand-in endpoint the day-2 tools' tests run against (tests/openai_standin.py)."""

import pytest

from openai_standin import Behaviour, serve
from ops.target import Target


@pytest.fixture
def endpoint():
    behaviour = Behaviour()
    server = serve(behaviour)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    yield behaviour, Target(endpoint=base + "/v1", api_key=behaviour.api_key, model=behaviour.model)
    server.shutdown()
